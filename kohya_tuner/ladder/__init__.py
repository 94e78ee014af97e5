"""The downgrade ladder: moves that lower a config's peak VRAM, and the policies that pick them.

The moves are data (`data/ladder.toml`, editable by a person); what each saves is computed by
the estimator for the config at hand, never stored. `fit` applies moves until the estimate is
under the budget, `tune` then gives speed back where the budget allows, and `next_step` picks
one move for the phase a real run ran out of memory in. All three are pure functions.
"""

from kohya_tuner.ladder.data import POLICIES, FileSwap, Ladder, Move, load_ladder, parse_ladder
from kohya_tuner.ladder.fit import apply_step, cautions, fit
from kohya_tuner.ladder.moves import FitResult, Step, facts
from kohya_tuner.ladder.tune import next_step, tune

__all__ = ["Move", "Step", "FitResult", "Ladder", "FileSwap", "load_ladder", "parse_ladder", "fit", "tune",
           "next_step", "apply_step", "facts", "cautions", "POLICIES"]
