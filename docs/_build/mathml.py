"""LaTeX to MathML at build time: no math library is loaded by the browser, nothing is fetched.

`pymdownx.arithmatex` (generic mode) finds ``$...$`` and ``$$...$$`` in the Markdown and leaves
them as ``<span class="arithmatex">\\(...\\)</span>`` and ``<div class="arithmatex">\\[...\\]</div>``;
`to_mathml` replaces each with the ``<math>`` element latex2mathml makes of it.
"""

from __future__ import annotations

import html
import re

from latex2mathml.converter import convert

_INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)
_BLOCK = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.S)


class MathError(ValueError):
    pass


def _convert(latex: str, display: str, where: str) -> str:
    try:
        return convert(html.unescape(latex).strip(), display=display)
    except Exception as e:  # latex2mathml raises several types; the build must name the formula
        raise MathError(f"{where}: cannot convert LaTeX {latex!r} to MathML: {e}") from e


def to_mathml(page_html: str, where: str) -> str:
    page_html = _BLOCK.sub(lambda mt: _convert(mt.group(1), "block", where), page_html)
    return _INLINE.sub(lambda mt: _convert(mt.group(1), "inline", where), page_html)
