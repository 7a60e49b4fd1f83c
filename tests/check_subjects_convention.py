"""A convention of a user's own module (tests/test_verdict.py), named on the command line as
``check_subjects_convention:CAPPED``: torch's SDPA signature plus a softcap keyword."""

from attnspec.backends import get_convention

CAPPED = get_convention("torch_sdpa").extend("capped_sdpa", keywords={"softcap": "softcap"})
