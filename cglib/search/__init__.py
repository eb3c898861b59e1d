"""The hyper-parameter search (notebook 08): Optuna studies over one train.runs entry, scored on a validation
slice of MAGIC train (study.py, validation.py). It trains with cglib.train and scores with cglib.evaluate, so it
sits above both."""
