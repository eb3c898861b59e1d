"""How the synthetic world looks: every object's icon (silhouette, colour, pattern) and every setting's background
(two colours split at a horizon, each with a texture, and the preposition captions use), as two readable tables
parsed at import. `cglib.data.render` draws them."""

from __future__ import annotations

from dataclasses import dataclass


# --------------------------------------------------------------------------------------------- objects
@dataclass(frozen=True)
class Icon:
    """How one object type is drawn: silhouette, main colour, pattern and its colour."""

    shape: str
    colour: str
    pattern: str
    secondary: str


# name | shape | colour | pattern | pattern colour. Every (shape, colour, pattern, pattern colour) is unique.
_OBJECT_TABLE = """
acacia tree      | flat_tree    | green       | solid    | brown
airplane         | airplane     | white       | band     | blue
anchor           | anchor       | grey        | solid    | black
apple            | circle       | red         | center   | green
apple tree       | round_tree   | green       | dots     | red
backpack         | bag          | orange      | band     | brown
badminton racket | racket       | white       | checker  | navy
balloon          | ellipse_tall | red         | solid    | white
baseball         | circle       | white       | lefthalf | red
baseball bat     | stick        | beige       | solid    | brown
baseball glove   | mitten       | brown       | center   | beige
basketball       | circle       | orange      | cross_p  | black
beach umbrella   | umbrella     | red         | vstripes | white
bench            | rect_wide    | brown       | hstripes | beige
binoculars       | hourglass    | black       | solid    | grey
bird             | bird         | blue        | solid    | yellow
blackboard       | rect_wide    | dark green  | band     | white
blanket          | square       | red         | checker  | white
book             | rect_tall    | blue        | lefthalf | white
bouquet          | flower       | pink        | center   | yellow
brick            | rect_wide    | dark red    | solid    | beige
broom            | tool         | beige       | vstripes | brown
bucket           | bucket       | blue        | band     | white
burger           | ellipse_wide | brown       | band     | green
bus              | long_vehicle | yellow      | band     | black
cake             | cylinder     | pink        | hstripes | white
camera           | bag          | black       | center   | silver
campfire         | triangle     | orange      | center   | yellow
candle           | candle       | white       | tophalf  | yellow
canvas           | rect_tall    | white       | center   | light blue
car              | vehicle      | red         | solid    | black
cargo ship       | ship         | navy        | band     | red
carousel horse   | animal       | white       | band     | gold
cello            | guitar       | dark red    | solid    | black
cereal bowl      | bowl         | light blue  | dots     | yellow
champagne glass  | glass        | gold        | solid    | white
chess piece      | pawn         | black       | solid    | white
child            | figure       | orange      | tophalf  | beige
clock            | circle       | white       | center   | black
clothes peg      | bar          | light green | band     | grey
coffee cup       | cup          | white       | tophalf  | brown
cookie           | circle       | beige       | dots     | brown
coral            | burst        | pink        | solid    | orange
cotton candy     | round_tree   | pink        | solid    | white
cow              | animal       | white       | dots     | black
crab             | crab         | red         | solid    | orange
crane            | crane        | yellow      | solid    | black
croissant        | crescent     | gold        | hstripes | brown
crow             | bird         | black       | solid    | grey
crown            | crown        | gold        | dots     | red
curtain          | rect_tall    | dark red    | vstripes | red
departure board  | rect_wide    | black       | hstripes | yellow
dice             | square       | white       | dots     | black
diploma          | rect_wide    | white       | band     | red
dog              | animal       | brown       | solid    | black
dove             | bird         | white       | solid    | grey
drum             | cylinder     | red         | band     | white
easel            | easel        | brown       | solid    | white
egg              | ellipse_tall | white       | solid    | beige
electric guitar  | guitar       | red         | center   | white
elephant         | big_animal   | grey        | solid    | white
fence            | fence        | white       | solid    | grey
ferris wheel     | wheel        | purple      | solid    | white
firework         | burst        | yellow      | center   | red
fish             | fish         | orange      | vstripes | white
fishing boat     | boat         | blue        | solid    | white
flag             | flag         | red         | hstripes | white
flask            | triangle     | light blue  | tophalf  | white
flour bag        | rect_tall    | white       | center   | beige
flower           | flower       | yellow      | center   | brown
flower pot       | bucket       | brown       | solid    | dark red
folding chair    | cross        | blue        | solid    | white
fork             | bar          | silver      | tophalf  | grey
fried egg        | circle       | white       | center   | yellow
fries            | rect_tall    | yellow      | vstripes | red
fruit crate      | square       | beige       | hstripes | brown
game board       | square       | white       | checker  | black
game controller  | crescent_wide| grey        | solid    | black
gift box         | square       | purple      | cross_p  | yellow
giraffe          | tall_animal  | yellow      | dots     | brown
globe            | circle       | blue        | dots     | green
goal net         | square       | white       | checker  | grey
goggles          | spectacles   | light blue  | band     | black
grill            | bowl         | black       | hstripes | grey
handrail         | stick        | silver      | solid    | grey
hard hat         | dome         | yellow      | band     | black
hay bale         | cylinder     | gold        | hstripes | beige
headphones       | headphones   | black       | solid    | red
helmet           | dome         | navy        | center   | white
hen              | bird         | beige       | solid    | red
hiking boot      | boot         | brown       | band     | beige
hockey stick     | stick        | black       | solid    | white
hoop             | ring         | orange      | solid    | white
ice skate        | boot         | black       | band     | silver
jeep             | vehicle      | green       | solid    | beige
jellyfish        | jellyfish    | pink        | solid    | white
jersey           | shirt        | blue        | vstripes | white
juice glass      | rect_tall    | orange      | tophalf  | white
ketchup bottle   | bottle       | red         | band     | white
knife            | sword        | grey        | solid    | black
ladder           | ladder       | beige       | solid    | brown
lamp             | lamp         | yellow      | solid    | brown
lantern          | hexagon      | orange      | center   | yellow
laptop           | screen       | silver      | center   | black
laundry basket   | bucket       | white       | checker  | beige
life jacket      | shirt        | orange      | band     | white
lighthouse       | tower        | white       | hstripes | red
loudspeaker      | rect_tall    | black       | center   | grey
luggage cart     | vehicle      | silver      | hstripes | grey
magnet           | magnet       | red         | solid    | silver
map              | rect_wide    | beige       | checker  | light blue
mask             | mask         | white       | lefthalf | black
menu             | rect_tall    | dark red    | band     | gold
microphone       | microphone   | silver      | solid    | black
microscope       | lamp         | white       | solid    | black
milk can         | bottle       | silver      | band     | blue
mixing bowl      | bowl         | white       | solid    | light blue
moon             | crescent     | yellow      | solid    | white
mortarboard      | hat          | black       | band     | gold
music stand      | sign         | black       | solid    | white
nest             | bowl         | brown       | dstripes | beige
net              | rect_wide    | white       | checker  | black
newspaper        | rect_tall    | white       | hstripes | black
notebook         | rect_tall    | light blue  | hstripes | white
oven mitt        | mitten       | red         | dots     | white
paintbrush       | tool         | brown       | tophalf  | red
palette          | crescent_wide| beige       | dots     | red
palm tree        | palm         | green       | solid    | brown
party hat        | triangle     | purple      | dots     | yellow
passport         | rect_tall    | navy        | center   | gold
pencil           | stick        | yellow      | solid    | black
pickaxe          | hammer       | grey        | tophalf  | brown
pigeon           | bird         | grey        | solid    | purple
pine tree        | tree         | dark green  | solid    | brown
pitchfork        | tool         | grey        | vstripes | brown
plate            | circle       | white       | solid    | grey
playing card     | rect_tall    | white       | center   | red
popcorn bowl     | bowl         | red         | vstripes | white
ring             | ring         | gold        | solid    | white
road barrier     | rect_wide    | red         | dstripes | white
roast chicken    | ellipse_wide | brown       | center   | gold
rolling pin      | rect_wide    | beige       | lefthalf | brown
rooster          | bird         | red         | tophalf  | gold
rope coil        | ring         | beige       | dstripes | brown
rubber glove     | mitten       | yellow      | solid    | white
sailboat         | boat         | white       | hstripes | blue
sandcastle       | house        | beige       | dots     | brown
sandwich         | triangle_down| beige       | band     | green
sausage          | ellipse_wide | dark red    | solid    | brown
scarecrow        | plus         | beige       | tophalf  | blue
scarf            | rect_tall    | red         | hstripes | white
scoreboard       | rect_wide    | black       | center   | yellow
seagull          | bird         | white       | lefthalf | grey
shirt            | shirt        | light blue  | solid    | white
shovel           | tool         | silver      | solid    | brown
shuttlecock      | cone         | white       | solid    | grey
ski pole         | bar          | black       | band     | red
skis             | stick        | red         | band     | white
sneaker          | boot         | white       | band     | blue
snowman          | snowman      | white       | center   | black
soccer ball      | circle       | white       | checker  | black
sock             | boot         | white       | hstripes | red
soda can         | rect_tall    | red         | band     | silver
soda cup         | bucket       | red         | tophalf  | white
sparkler         | burst        | white       | solid    | yellow
sponge           | rect_wide    | yellow      | dots     | green
spoon            | racket       | silver      | solid    | grey
spotlight        | lamp         | black       | solid    | yellow
spray bottle     | bottle       | light blue  | tophalf  | white
starfish         | star         | orange      | dots     | yellow
streamer         | stick        | pink        | dstripes | light blue
street sign      | sign         | green       | band     | white
suitcase         | bag          | navy        | vstripes | grey
sunglasses       | spectacles   | black       | solid    | grey
surfboard        | ellipse_tall | light blue  | band     | white
sword            | sword        | silver      | solid    | gold
taxi             | vehicle      | yellow      | checker  | black
television       | screen       | black       | center   | light blue
tennis ball      | circle       | light green | solid    | white
tennis racket    | racket       | red         | checker  | white
tent             | tent         | green       | solid    | dark green
test tube        | rect_tall    | white       | tophalf  | green
ticket           | rect_wide    | pink        | lefthalf | white
toast            | square       | gold        | center   | beige
towel            | rect_tall    | teal        | hstripes | white
tractor          | truck        | green       | solid    | yellow
traffic cone     | cone         | orange      | band     | white
traffic light    | rect_tall    | black       | vstripes | green
train            | long_vehicle | blue        | hstripes | white
tray             | rect_wide    | grey        | solid    | black
trophy           | cup          | gold        | solid    | brown
truck            | truck        | white       | solid    | red
trumpet          | cone         | gold        | solid    | beige
turtle           | turtle       | green       | checker  | dark green
umbrella         | umbrella     | black       | solid    | grey
vacuum cleaner   | bag          | purple      | solid    | black
violin           | guitar       | brown       | solid    | black
visor            | hat          | white       | solid    | green
walking stick    | stick        | brown       | solid    | black
washing machine  | square       | white       | center   | light blue
whistle          | cup          | silver      | solid    | black
water bottle     | bottle       | light blue  | band     | blue
watering can     | cup          | green       | solid    | white
wetsuit          | shirt        | black       | band     | blue
wheat sheaf      | flat_tree    | gold        | vstripes | brown
wheelbarrow      | bowl         | green       | band     | black
whisk            | racket       | silver      | vstripes | grey
wicker basket    | bucket       | beige       | dstripes | brown
wine bottle      | bottle       | dark green  | band     | beige
wine glass       | glass        | dark red    | tophalf  | white
woolly hat       | dome         | red         | hstripes | white
zebra            | animal       | white       | vstripes | black
"""

def _parse_objects(table: str) -> dict[str, Icon]:
    icons: dict[str, Icon] = {}
    for line in table.strip().splitlines():
        name, shape, colour, pattern, secondary = (part.strip() for part in line.split("|"))
        icons[name] = Icon(shape, colour, pattern, secondary)
    return icons


OBJECTS: dict[str, Icon] = _parse_objects(_OBJECT_TABLE)


# -------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Setting:
    """A background: top and bottom colours split at `horizon` (fraction of height), each with a texture."""

    prep: str  # preposition captions use: "in", "on", "at", "under", "by"
    article: str  # "a": either "a" or "the" in captions; "the": always "the" ("on the open sea")
    top: tuple[int, int, int]
    bottom: tuple[int, int, int]
    horizon: float
    top_texture: str
    bottom_texture: str


def _hex(code: str) -> tuple[int, int, int]:
    code = code.lstrip("#")
    return int(code[0:2], 16), int(code[2:4], 16), int(code[4:6], 16)


# name | prep | article | top colour | bottom colour | horizon | top texture | bottom texture
_SETTING_TABLE = """
living room      | in    | a   | #e8d9b5 | #8b5a2b | 0.62 | plain    | planks
backyard         | in    | a   | #b08a5a | #5aa845 | 0.45 | planks   | grass
chapel           | in    | a   | #f0ead8 | #9b9b9b | 0.65 | arches   | tiles
garden           | in    | a   | #a8dcf5 | #4f9d3a | 0.35 | plain    | flowers
auditorium       | in    | an  | #7a1f2b | #4a3b2a | 0.5  | vstripes | rows
city street      | on    | a   | #b9c7d6 | #6b6b6b | 0.5  | blocks   | dashes
town square      | in    | a   | #aee0f7 | #c9b79c | 0.4  | plain    | tiles
fairground       | at    | a   | #8fd0ff | #c8a46e | 0.4  | plain    | noise
night sky        | under | a   | #0d1440 | #0d1440 | 1.0  | stars    | plain
riverside        | by    | a   | #5b6fa8 | #2f6e8f | 0.45 | plain    | waves
soccer field     | on    | a   | #8fcdf5 | #3d9b35 | 0.25 | plain    | mowing
stadium          | in    | a   | #7d8793 | #3f8f3a | 0.45 | crowd    | plain
gymnasium        | in    | a   | #d9c6a0 | #c89a5b | 0.5  | plain    | boards
baseball field   | on    | a   | #9bd4f5 | #b07a4a | 0.35 | plain    | noise
tennis court     | on    | a   | #a5d8f2 | #3a6fb0 | 0.3  | plain    | lines
ski slope        | on    | a   | #7ec3f2 | #f4f7fb | 0.35 | plain    | slope
snowy mountain   | on    | a   | #9fc9ef | #e6edf5 | 0.5  | peaks    | noise
ice rink         | on    | an  | #cfd8e3 | #dff3fb | 0.35 | boards   | scratches
frozen lake      | on    | a   | #b7cde3 | #bfe3f1 | 0.45 | peaks    | scratches
beach            | on    | a   | #87cff5 | #ecd59a | 0.45 | plain    | speckle
open sea         | on    | the | #8ccbf2 | #1f5fa8 | 0.35 | plain    | waves
dock             | at    | a   | #2c6da3 | #8a6a47 | 0.45 | waves    | boards
kitchen          | in    | a   | #f5f1e6 | #d8d8d8 | 0.6  | tiles    | checker
dining room      | in    | a   | #c9a27e | #6b4226 | 0.6  | vstripes | planks
restaurant       | in    | a   | #6e2f2f | #3b2a20 | 0.6  | plain    | checker
cafe             | in    | a   | #d9b38c | #7a5230 | 0.55 | plain    | tiles
office           | in    | an  | #dfe6ea | #8899a6 | 0.6  | windows  | noise
food court       | in    | a   | #f2e2b8 | #b0b0b0 | 0.55 | plain    | tiles
park             | in    | a   | #a6dbf7 | #6cbf4a | 0.4  | plain    | grass
meadow           | in    | a   | #b5e2f9 | #8fcf55 | 0.3  | plain    | flowers
railway platform | on    | a   | #a9b4bf | #8c8c8c | 0.45 | plain    | rails
subway platform  | on    | a   | #e6e0c8 | #5c5c5c | 0.55 | tiles    | edge
highway          | on    | a   | #a0cdef | #555555 | 0.4  | plain    | dashes
terminal hall    | in    | a   | #cfe3f0 | #e2e2e2 | 0.55 | windows  | tiles
runway           | on    | a   | #9ed0f5 | #6e6e6e | 0.5  | plain    | centerline
savanna          | on    | the | #f5d08a | #d2b055 | 0.45 | plain    | grass
forest           | in    | a   | #2e6b34 | #4a3a22 | 0.7  | trunks   | noise
wetland          | in    | a   | #b8d9e8 | #6f8f4a | 0.45 | plain    | reeds
aquarium         | in    | an  | #1b6fa6 | #1b6fa6 | 1.0  | bubbles  | plain
lakeside         | by    | a   | #3c8a4c | #4f8fc0 | 0.4  | noise    | waves
mountain trail   | on    | a   | #a6cff0 | #8a7a5a | 0.45 | peaks    | speckle
pasture          | in    | a   | #b0dcf5 | #79c24a | 0.5  | plain    | noise
barn             | in    | a   | #a8322d | #c9a55a | 0.55 | planks   | straw
farmyard         | in    | a   | #a9d8f2 | #9a7b4f | 0.4  | plain    | speckle
wheat field      | in    | a   | #a9d9f7 | #e0b84a | 0.35 | plain    | straw
orchard          | in    | an  | #b3def7 | #5fae44 | 0.35 | plain    | rowsdots
building site    | on    | a   | #b7d0e3 | #a0845c | 0.45 | scaffold | noise
laundry room     | in    | a   | #d7ecf2 | #f0f0f0 | 0.6  | plain    | tiles
bedroom          | in    | a   | #c9b6e4 | #8b6a4f | 0.6  | dots     | planks
stage            | on    | a   | #1a1a1a | #6b3b1c | 0.65 | spot     | boards
concert hall     | in    | a   | #5a2a1a | #7a1c1c | 0.55 | vstripes | rows
classroom        | in    | a   | #f0e6c8 | #9c7a54 | 0.6  | plain    | planks
laboratory       | in    | a   | #eef3f6 | #cfd6db | 0.6  | grid     | tiles
art studio       | in    | an  | #f7f3ea | #b58e63 | 0.6  | spatter  | planks
"""


def _parse_settings(table: str) -> dict[str, Setting]:
    settings: dict[str, Setting] = {}
    for line in table.strip().splitlines():
        name, prep, article, top, bottom, horizon, top_tex, bottom_tex = (p.strip() for p in line.split("|"))
        settings[name] = Setting(prep, article, _hex(top), _hex(bottom), float(horizon), top_tex, bottom_tex)
    return settings


SETTINGS: dict[str, Setting] = _parse_settings(_SETTING_TABLE)
