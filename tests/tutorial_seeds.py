"""The tutorials' three attention functions (``examples/tutorial/seed_attention.py``, from
shared/seeds), as a new user checks them: one table, read by tests/conftest.py's session run and by
the tests that read it (tests/test_check.py, tests/test_new_users.py)."""

from pathlib import Path

SEEDS = Path(__file__).parent.parent / "examples" / "tutorial" / "seed_attention.py"
#: name -> the function, as ``attnspec check`` takes it
TUTORIAL_SEEDS = {
    name: f"{SEEDS}:{name}" for name in ("fill_neg_inf", "fill_neg_1e9_nan_to_num", "fill_neg_1e9")
}
