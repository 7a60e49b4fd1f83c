"""Build-time helpers of the documentation site (`docs/hooks.py` loads them): the spec pages, the
worked examples, the visibility pictures, LaTeX to MathML, and the links to repository files."""
