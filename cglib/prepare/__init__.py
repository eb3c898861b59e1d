"""The preparation stage: the data every training run reads, built before training (stage.py).

    inputs.py    magic.json (or its n-gram groups) and the image cache of its images: TrainInputs
    base.py      the base corpus (train.base.corpus) and whether the initial weights must still be trained
    re_items.py  the RE items of `loss: re` runs
    stage.py     prepare_inputs: all of the above for the named runs and seeds, and its account
                 (training/prepare.json)

Training (cglib.train) receives what it prepared and imports only its types from the data layers.
"""

from cglib.prepare.base import BaseCorpus
from cglib.prepare.inputs import TrainInputs, load_inputs, model_image_size
from cglib.prepare.re_items import REItems, re_items
from cglib.prepare.stage import PreparedInputs, account_rows, prepare_inputs

__all__ = ["BaseCorpus", "PreparedInputs", "REItems", "TrainInputs", "account_rows", "load_inputs", "model_image_size",
           "prepare_inputs", "re_items"]
