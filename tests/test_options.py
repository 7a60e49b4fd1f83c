"""The sdpa keyword table (`attnspec.spec.options`) is the one list: the golden's signature equals
it, every other layer accepts exactly its keywords, and no module writes the list out again."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest

import attnspec.spec as spec
from attnspec.backends import available, builtin_names, get
from attnspec.backends.base import SPEC_FUNCTIONS, Backend
from attnspec.spec import options
from attnspec.spec.blocked import sdpa_blocked
from attnspec.spec.fp8 import sdpa_fp8
from attnspec.spec.grads import sdpa_vjp
from attnspec.spec.grads_mha import mha_vjp
from attnspec.spec.mha import mha
from attnspec.spec.sdpa import sdpa
from attnspec.spec.sdpa_loops import sdpa_loops

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ("spec", "backends", "conformance", "reports", "bench", "src")

#: each spec form, and whether it takes the return_* keywords
FORMS = [
    (sdpa, True),
    (sdpa_loops, True),
    (sdpa_blocked, True),
    (sdpa_fp8, True),
    (mha, True),
    (sdpa_vjp, False),
    (mha_vjp, False),
]


def table_keywords(outputs: bool) -> list[str]:
    return list(options.NAMES if outputs else options.INPUT_NAMES)


def sdpa_keywords(fn) -> list[str]:
    """The keyword-only parameters of ``fn`` that are sdpa's (not its own, like block_q)."""
    return [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name in options.NAMES
    ]


def test_the_golden_signature_is_the_table_keyword_for_keyword():
    ours = [
        p for p in inspect.signature(sdpa).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    assert ours == options.parameters()  # name, order, default and annotation


@pytest.mark.parametrize(("fn", "outputs"), FORMS, ids=[f.__name__ for f, _ in FORMS])
def test_every_spec_form_shows_the_table(fn, outputs):
    assert sdpa_keywords(fn) == table_keywords(outputs)


@pytest.mark.parametrize(("fn", "outputs"), FORMS, ids=[f.__name__ for f, _ in FORMS])
def test_every_spec_form_refuses_a_keyword_outside_the_table(fn, outputs):
    q = np.zeros((1, 2, 4))
    args = {"sdpa_vjp": (q, q, q, q), "mha": (q, q, q, None), "mha_vjp": (q, q, q, None, q)}.get(
        fn.__name__, (q, q, q)
    )
    heads = {"num_heads": 1} if fn in (mha, mha_vjp) else {}
    with pytest.raises(TypeError, match="unexpected keyword argument 'is_causal'"):
        fn(*args, **heads, is_causal=True)  # refused before anything is read (mha's params included)
    if not outputs:
        with pytest.raises(TypeError, match="unexpected keyword argument 'return_lse'"):
            fn(*args, **heads, return_lse=True)


SDPA_SHAPED = [(sdpa, True), (sdpa_loops, True), (sdpa_blocked, True), (sdpa_vjp, False)]


@pytest.mark.parametrize(("fn", "outputs"), SDPA_SHAPED, ids=[f.__name__ for f, _ in SDPA_SHAPED])
def test_every_table_keyword_reaches_the_form(fn, outputs):
    """Not just shown: each keyword is read. A value the spec refuses, given through the form,
    is refused naming that keyword. (mha and sdpa_fp8 take other inputs; their own tests give
    each keyword a refused value.)"""
    q = np.zeros((1, 2, 4))
    args = (q, q, q, q) if fn is sdpa_vjp else (q, q, q)
    bad = {
        "mask": np.zeros((3, 3)),
        "bias": np.zeros((3, 3)),
        "causal": "diagonal",
        "window": (-1, 0),
        "scale": -1.0,
        "q_lengths": -1,
        "kv_lengths": -1,
        "softcap": -1.0,
        "alibi_slopes": np.zeros(5),
        "sinks": np.zeros(5),
        "q_segment_ids": np.zeros((1, 7), np.int32),
        "kv_segment_ids": np.zeros((1, 7), np.int32),
        "dropout_mask": np.zeros((3, 3), bool),
        "dropout_p": 1.5,
        "return_weights": "yes",
        "return_lse": "yes",
    }
    assert set(bad) == set(options.NAMES)
    for name in table_keywords(outputs):
        if name == "return_weights":
            continue  # any truthy value asks for the weights; it has no refusal to observe
        with pytest.raises(spec.SpecError, match=name):
            fn(*args, **{name: bad[name]})


def test_every_backend_method_accepts_the_same_set():
    """The Backend contract and each built-in backend that can be built here: every spec function
    it implements takes the table's keywords (spec_signature_mismatches checks order and defaults)."""
    for fn in ("sdpa", "sdpa_blocked", "sdpa_fp8", "sdpa_vjp", "mha", "mha_vjp"):
        outputs = not fn.endswith("_vjp")
        assert sdpa_keywords(getattr(Backend, fn)) == table_keywords(outputs), fn
    checked = 0
    here = available()
    for name in builtin_names():
        if not here[name].installed:
            continue
        backend = get(name)
        for fn in sorted(backend.implements & set(SPEC_FUNCTIONS)):
            outputs = not fn.endswith("_vjp")
            if fn.startswith("lsh"):
                assert lsh_keywords(getattr(backend, fn)) == lsh_table(outputs), (name, fn)
            else:
                assert sdpa_keywords(getattr(backend, fn)) == table_keywords(outputs), (name, fn)
            checked += 1
    assert checked >= 8  # numpy alone implements eight of them


TYPED = [
    (options.SDPAOptions, options.OPTIONS, True),
    (options.SDPAInputs, options.OPTIONS, False),
    (options.LSHOptions, options.LSH_OPTIONS, True),
    (options.LSHInputs, options.LSH_OPTIONS, False),
    (options.FP8Options, options.FP8_OPTIONS, True),
]


@pytest.mark.parametrize(("typed", "table", "outputs"), TYPED, ids=[t.__name__ for t, _, _ in TYPED])
def test_each_typed_dict_is_its_table(typed, table, outputs):
    """The TypedDicts that type the Backend contract's ``**options`` (for mypy) hold the table's
    keywords, in its order, required exactly where the table requires them."""
    rows = [o for o in table if outputs or o.kind != "output"]
    assert list(typed.__annotations__) == [o.name for o in rows]
    assert typed.__required_keys__ == {o.name for o in rows if o.default is options.REQUIRED}


def test_sdpa_fp8_is_its_table_and_every_backend_shows_it():
    """sdpa_fp8's own keywords (the descales, out_dtype) then sdpa's: the golden writes its own four
    out, and the table holds them, so the Backend contract and the backends derive the rest."""
    ours = [
        p for p in inspect.signature(sdpa_fp8).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    assert ours == options.parameters(table=options.FP8_OPTIONS)
    names = [o.name for o in options.FP8_OPTIONS]
    assert names[4:] == list(options.NAMES)
    for fn in (Backend.sdpa_fp8, get("numpy").sdpa_fp8):
        shown = [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        ]
        assert shown == names, fn
    with pytest.raises(TypeError, match="unexpected keyword argument 'k_scale'"):
        get("numpy").sdpa_fp8(np.zeros((1, 2, 4)), np.zeros((1, 2, 4)), np.zeros((1, 2, 4)), k_scale=1.0)


def lsh_table(outputs: bool) -> list[inspect.Parameter]:
    return options.parameters(outputs=outputs, annotated=False, table=options.LSH_OPTIONS)


def lsh_keywords(fn) -> list[inspect.Parameter]:
    """The keyword-only parameters of ``fn``, unannotated (a backend need not annotate them)."""
    return [
        p.replace(annotation=inspect.Parameter.empty)
        for p in inspect.signature(fn).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]


def test_lsh_attention_is_its_table_keyword_for_keyword():
    """The golden's signature is `LSH_OPTIONS` (name, order, default, annotation); its vjp, its
    loops and the Backend contract show the same keywords (the vjp without return_buckets)."""
    ours = [
        p
        for p in inspect.signature(spec.lsh_attention).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    assert ours == options.parameters(table=options.LSH_OPTIONS)
    from attnspec.spec._lsh_loops import _lsh_attention_loops

    for fn, outputs in [
        (spec.lsh_attention_vjp, False),
        (_lsh_attention_loops, True),
        (Backend.lsh_attention, True),
        (Backend.lsh_attention_vjp, False),
    ]:
        assert lsh_keywords(fn) == lsh_table(outputs), fn


def test_lsh_forms_refuse_a_keyword_outside_the_table_and_require_theirs():
    x = np.zeros((4, 2), np.float32)
    rotations = np.zeros((2, 1, 1), np.float32)
    numpy = get("numpy")
    forms = [
        (spec.lsh_attention, (x, x)),
        (spec.lsh_attention_vjp, (x, x, x)),
        (numpy.lsh_attention, (x, x)),
        (numpy.lsh_attention_vjp, (x, x, x)),
    ]
    for fn, args in forms:
        with pytest.raises(TypeError, match="unexpected keyword argument 'n_hashes'"):
            fn(*args, rotations=rotations, chunk_length=2, n_hashes=1)
        with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'chunk_length'"):
            fn(*args, rotations=rotations)
    with pytest.raises(TypeError, match="unexpected keyword argument 'return_buckets'"):
        spec.lsh_attention_vjp(x, x, x, rotations=rotations, chunk_length=2, return_buckets=True)


def test_the_variant_lists_derive_from_the_table():
    assert options.VARIANT_ARRAYS == (
        "alibi_slopes",
        "sinks",
        "q_segment_ids",
        "kv_segment_ids",
        "dropout_mask",
    )
    assert set(options.VARIANT_ARRAYS) <= set(options.VARIANT_KEYWORDS) <= set(options.NAMES)
    assert {o.variant for o in options.OPTIONS if o.variant} <= set(options.VARIANT_FEATURES)
    from attnspec.spec.validate import SDPAExtras

    assert tuple(f.name for f in __import__("dataclasses").fields(SDPAExtras)) == options.VARIANT_ARRAYS


def _tuples_of_strings(tree: ast.AST):
    for node in ast.walk(tree):
        strings = (
            isinstance(node, (ast.Tuple, ast.List))
            and len(node.elts) >= 4
            and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
        )
        if strings:
            yield node.lineno, [e.value for e in node.elts]


#: the lists derived from the table, and the one mha passes on to sdpa (all but mask, bias and
#: return_weights)
DERIVED = [
    set(options.NAMES),
    set(options.INPUT_NAMES),
    set(options.VARIANT_ARRAYS),
    set(options.VARIANT_KEYWORDS),
    set(options.ARRAY_NAMES),
    set(options.VALUE_NAMES),
    set(options.NAMES) - {"mask", "bias", "return_weights"},
]


def test_no_module_writes_a_keyword_list_again():
    """A literal tuple or list in the package that holds one of the table's derived lists, or
    eight or more of its keywords, is a copy: derive it from attnspec.spec.options instead. (A
    shorter selection, such as the keywords one calling convention can carry, is not a copy.)"""
    copies = []
    for folder in PACKAGE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "spec" / "options.py":
                continue
            for line, names in _tuples_of_strings(ast.parse(path.read_text(encoding="utf-8"))):
                if set(names) in DERIVED or sum(n in options.NAMES for n in names) >= 8:
                    copies.append(f"{path.relative_to(ROOT)}:{line}: {names}")
    assert not copies, "\n".join(copies)


def test_the_dtype_and_variant_tables_are_written_once():
    """The float dtypes and the variant features: one literal each, in their home module."""
    homes = {
        ("float16", "bfloat16", "float32", "float64"): "spec/dtypes.py",
        options.VARIANT_FEATURES: "spec/options.py",
    }
    found: dict[tuple[str, ...], list[str]] = {t: [] for t in homes}
    for folder in (*PACKAGE, "docs"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, names in _tuples_of_strings(ast.parse(path.read_text(encoding="utf-8"))):
                for table in homes:
                    if tuple(names[: len(table)]) == table:
                        found[table].append(f"{path.relative_to(ROOT)}:{line}")
    for table, home in homes.items():
        assert [f.split(":")[0] for f in found[table]] == [home], found[table]
