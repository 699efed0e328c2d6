"""Exercise checks for the course notebooks, one module per lesson.

Every check cell in a notebook calls one function from here, so the same
check runs in the notebook, in `pytest --nbval` and in the test suite (which
also feeds it typical wrong answers and reads the hint it gives).
"""
from ._core import ExerciseError, attempt, close, passed
from ._vetting import start_spare
from .pieces import load_piece, pieces_dir, piece_for_slot, save_piece

start_spare()       # a child for vetting the first piece, its imports done while you read

__all__ = ["ExerciseError", "attempt", "passed", "close", "save_piece", "load_piece",
           "piece_for_slot", "pieces_dir"]
