"""The copy task, trained through `backend.mha`: ``python -m attnspec.bench.copy_task``.

A worked example of the backends' multi-head attention in training, after the copy demo of the
tutorials attnspec grew out of. The model reads n random tokens and must output, at every
position i, the token at position i:

    x      = embed[tokens] + sinusoidal_positions(n, E)       (B, n, E)
    out, w = backend.mha(x, x, x, mha_params, num_heads=H)    (B, n, E), (B, H, n, n)
    logits = out @ w_r.T + b_r                                (B, n, V)
    loss   = mean cross-entropy(logits, tokens)

There is no residual connection, so the readout sees token i only through attention: the task
is solved by attending from i to i, and the attention map goes from diffuse (about 1/n on the
diagonal) to sharp and diagonal. torch (autograd) and JAX (`jax.grad`) train the same model from
the same NumPy initial parameters on the same batches, each with Adam written here in its own
framework, in float32.

The tutorial's version had bugs, fixed here: it built a fresh random ``nn.Embedding`` inside the
training loop (a new target every step, and never trained); it regressed the output onto that
embedding with MSE instead of predicting tokens; it had no positional encoding (attention is
then permutation-equivariant, and a repeated token cannot be told from its twin); and it
trained on two fixed sequences (memorizable) with no held-out check.

Writes ``reports/results/copy_task.json`` (schema ``attnspec.copy_task/1``: the settings and
seeds; per framework the training loss before each step, the held-out loss, accuracy and
diagonal attention mass before and after training, the held-out attention map averaged over
sequences and heads, the wall time of the training loop, the framework's version, and for JAX
whether the step ran under `jax.jit`). It computes and writes results only, as the benchmarks
do: `nox -s report` draws the figure ``reports/plots/copy_task.png`` from the JSON and gives it a
"Copy task" section in ``reports/index.md`` (`attnspec.reports.copy_task_report`, which checks
the schema named here). `nox -s demo` runs both. Importing this module imports neither torch nor
JAX.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import platform
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from attnspec.errors import SpecError
from attnspec.results import framework_versions, git_state, write_json_atomic
from attnspec.spec import MHAParams
from attnspec.spec.positions import sinusoidal_positions

#: the results format, which `attnspec.reports.copy_task_report` reads
SCHEMA = "attnspec.copy_task/1"

__all__ = [
    "FRAMEWORKS",
    "SCHEMA",
    "Settings",
    "batches",
    "diagonal_mass",
    "initial_params",
    "main",
    "run",
    "train",
]

FRAMEWORKS = ("torch", "jax")
DTYPE = "float32"


@dataclass(frozen=True)
class Settings:
    """Sizes, seeds and optimizer of one run (the defaults are the committed report's)."""

    vocab: int = 64  # V; large enough that a token seldom repeats within a sequence
    n: int = 8  # sequence length
    embed_dim: int = 32  # E
    num_heads: int = 2  # H
    batch: int = 32  # B, a fresh batch every step
    steps: int = 300
    lr: float = 0.01  # Adam
    beta1: float = 0.9
    beta2: float = 0.999
    adam_eps: float = 1e-8
    eval_batch: int = 256  # held-out sequences
    seed: int = 0  # initial parameters
    data_seed: int = 1  # training batches; the held-out batch uses data_seed + 1


# -- the framework-free parts ---------------------------------------------------------------------
def initial_params(s: Settings) -> dict[str, Any]:
    """NumPy float32 parameters: embed (V, E), mha (MHAParams), w_r (V, E), b_r (V,).

    A pure function of ``s.seed``, so every framework starts from the same point. The embedding
    is standard normal (its rows then outweigh the positions' unit-amplitude sinusoids); the
    readout is Xavier uniform, like `MHAParams.init`, with a zero bias.
    """
    rng = np.random.default_rng(s.seed)
    limit = math.sqrt(6.0 / (s.vocab + s.embed_dim))
    return {
        "embed": rng.standard_normal((s.vocab, s.embed_dim)).astype(np.float32),
        "mha": MHAParams.init(s.embed_dim, s.num_heads, seed=s.seed, dtype=np.float32),
        "w_r": rng.uniform(-limit, limit, (s.vocab, s.embed_dim)).astype(np.float32),
        "b_r": np.zeros(s.vocab, np.float32),
    }


def batches(s: Settings) -> tuple[np.ndarray, np.ndarray]:
    """Training tokens (steps, B, n) and held-out tokens (eval_batch, n), uniform over V.

    Drawn with replacement, so a token can repeat within a sequence: content alone cannot always
    single out position i, the positions are needed.
    """
    train = np.random.default_rng(s.data_seed).integers(0, s.vocab, (s.steps, s.batch, s.n))
    held_out = np.random.default_rng(s.data_seed + 1).integers(0, s.vocab, (s.eval_batch, s.n))
    return train, held_out


def diagonal_mass(weights: np.ndarray) -> float:
    """Mean of w[..., i, i] over every leading index and i: 1 for a perfect copy, 1/n uniform."""
    w = np.asarray(weights, dtype=np.float64)
    return float(np.diagonal(w, axis1=-2, axis2=-1).mean())


def _rounded(x: Any, digits: int = 6) -> Any:
    """Floats to ``digits`` significant digits: a small JSON that diffs well."""
    if isinstance(x, np.ndarray):
        return _rounded(x.tolist(), digits)
    if isinstance(x, dict):
        return {k: _rounded(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_rounded(v, digits) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(f"{float(x):.{digits}g}")
    return x


# -- the two frameworks ---------------------------------------------------------------------------
# Each builds (step, evaluate, version, info) over one backend: step(tokens, t) runs Adam step t
# (from 1) on one batch and returns the loss before it; evaluate(tokens) returns the loss, the
# accuracy and the weights (B, H, n, n) as NumPy; info holds extra fields for the record.


def _on_backend(backend, params0: dict[str, Any]) -> dict[str, Any]:
    return {
        "embed": backend.asarray(params0["embed"], DTYPE),
        "mha": backend.asparams(params0["mha"], DTYPE),
        "w_r": backend.asarray(params0["w_r"], DTYPE),
        "b_r": backend.asarray(params0["b_r"], DTYPE),
    }


def _torch_parts(backend, s: Settings, params0: dict[str, Any]):
    import torch
    import torch.nn.functional as F

    pe = torch.from_numpy(sinusoidal_positions(s.n, s.embed_dim).astype(np.float32))  # (n, E)
    params = _on_backend(backend, params0)
    mha = params["mha"]
    leaves = [
        params["embed"],
        params["w_r"],
        params["b_r"],
        *(getattr(mha, f.name) for f in fields(mha) if getattr(mha, f.name) is not None),
    ]
    for p in leaves:
        p.requires_grad_(True)
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in leaves]

    def forward(tokens: np.ndarray):
        tok = torch.from_numpy(tokens)  # (B, n)
        x = params["embed"][tok] + pe  # (B, n, E)
        out, w = backend.mha(x, x, x, mha, num_heads=s.num_heads, return_weights=True)
        logits = out @ params["w_r"].T + params["b_r"]  # (B, n, E) @ (E, V) -> (B, n, V)
        loss = F.cross_entropy(logits.reshape(-1, s.vocab), tok.reshape(-1))  # (B*n, V) vs (B*n,)
        return loss, logits, w

    def step(tokens: np.ndarray, t: int) -> float:
        loss, _, _ = forward(tokens)
        grads = torch.autograd.grad(loss, leaves)
        with torch.no_grad():
            for p, g, (m, v) in zip(leaves, grads, moments):
                m.mul_(s.beta1).add_(g, alpha=1 - s.beta1)
                v.mul_(s.beta2).addcmul_(g, g, value=1 - s.beta2)
                m_hat, v_hat = m / (1 - s.beta1**t), v / (1 - s.beta2**t)
                p.sub_(s.lr * m_hat / (v_hat.sqrt() + s.adam_eps))
        return float(loss.detach())

    def evaluate(tokens: np.ndarray):
        with torch.no_grad():
            loss, logits, w = forward(tokens)
            acc = (logits.argmax(-1) == torch.from_numpy(tokens)).double().mean()
            return float(loss), float(acc), w.numpy()

    return step, evaluate, torch.__version__, {}


def _jax_parts(backend, s: Settings, params0: dict[str, Any]):
    import jax
    import jax.numpy as jnp

    tree_map = jax.tree_util.tree_map
    pe = jnp.asarray(sinusoidal_positions(s.n, s.embed_dim), dtype=jnp.float32)  # (n, E)
    params = _on_backend(backend, params0)
    state = {"params": params, "m": tree_map(jnp.zeros_like, params), "v": tree_map(jnp.zeros_like, params)}
    info = {"jit": True}  # set False if backend.mha cannot be traced by jax.jit

    def forward(p, tokens):
        x = p["embed"][tokens] + pe  # (B, n, E)
        out, w = backend.mha(x, x, x, p["mha"], num_heads=s.num_heads, return_weights=True)
        logits = out @ p["w_r"].T + p["b_r"]  # (B, n, E) @ (E, V) -> (B, n, V)
        logp = jax.nn.log_softmax(logits, axis=-1)  # (B, n, V)
        loss = -jnp.mean(jnp.take_along_axis(logp, tokens[..., None], axis=-1))  # (B, n, 1) -> ()
        return loss, (logits, w)

    grad_fn = jax.value_and_grad(forward, has_aux=True)

    @jax.jit  # compiled even when `update` cannot be: Adam never calls backend.mha
    def adam(params, m, v, g, t):
        m = tree_map(lambda m, g: s.beta1 * m + (1 - s.beta1) * g, m, g)
        v = tree_map(lambda v, g: s.beta2 * v + (1 - s.beta2) * g * g, v, g)
        c1, c2 = 1 - s.beta1**t, 1 - s.beta2**t
        params = tree_map(lambda p, m, v: p - s.lr * (m / c1) / (jnp.sqrt(v / c2) + s.adam_eps), params, m, v)
        return params, m, v

    def update(params, m, v, tokens, t):
        (loss, _), g = grad_fn(params, tokens)
        return (loss, *adam(params, m, v, g, t))

    jitted = jax.jit(update)

    def step(tokens: np.ndarray, t: int) -> float:
        args = (state["params"], state["m"], state["v"], jnp.asarray(tokens), jnp.float32(t))
        if info["jit"]:
            try:
                loss, *new = jitted(*args)
            except jax.errors.JAXTypeError:  # backend.mha reads values back: train eagerly
                info["jit"] = False
        if not info["jit"]:
            loss, *new = update(*args)
        state["params"], state["m"], state["v"] = new
        return float(loss)

    def evaluate(tokens: np.ndarray):
        loss, (logits, w) = forward(state["params"], jnp.asarray(tokens))
        acc = jnp.mean((jnp.argmax(logits, -1) == tokens).astype(jnp.float32))
        return float(loss), float(acc), np.asarray(w)

    return step, evaluate, jax.__version__, info


_PARTS: dict[str, Callable] = {"torch": _torch_parts, "jax": _jax_parts}


@contextmanager
def _one_thread(framework: str):
    """torch on one thread: with matrices this small, more threads only add synchronization,
    and on a busy machine they stall each other (10x slower, measured on 2 shared cores)."""
    if framework != "torch":
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train(framework: str, s: Settings = Settings(), backend=None) -> dict[str, Any]:
    """Train the copy model with ``framework`` ("torch" or "jax"); return its results record.

    ``backend`` defaults to ``attnspec.backends.get(framework)``. The record holds the training
    loss before each step; the held-out loss, accuracy, diagonal mass (overall and per head) and
    attention map (averaged over sequences and heads, (n, n)) before and after training; and the
    wall time of the training loop (JAX: compilation included).
    """
    if framework not in _PARTS:
        raise SpecError(f"copy_task.train: framework={framework!r} must be one of {', '.join(_PARTS)}")
    if backend is None:
        from attnspec import backends

        backend = backends.get(framework)
    train_tokens, held_out = batches(s)
    with _one_thread(framework):
        step, evaluate, version, info = _PARTS[framework](backend, s, initial_params(s))
        record: dict[str, Any] = {"framework": framework, "backend": backend.name, "version": version}
        for when in ("before", "after"):
            if when == "after":
                started = time.perf_counter()
                record["losses"] = [step(train_tokens[t], t + 1) for t in range(s.steps)]
                record["wall_s"] = time.perf_counter() - started
            loss, acc, w = evaluate(held_out)  # w: (eval_batch, H, n, n)
            record[when] = {
                "loss": loss,
                "accuracy": acc,
                "diagonal_mass": diagonal_mass(w),
                "diagonal_mass_per_head": [diagonal_mass(w[:, h]) for h in range(w.shape[1])],
                "weights": w.mean(axis=(0, 1)),  # (n, n)
            }
    record.update(info)
    return record


def run(frameworks: tuple[str, ...] = FRAMEWORKS, s: Settings = Settings()) -> dict[str, Any]:
    """Train with each framework in turn; the document `main` writes (schema `SCHEMA`)."""
    started = time.time()
    records = [train(f, s) for f in frameworks]
    doc = {
        "schema": SCHEMA,
        "settings": asdict(s),
        "dtype": DTYPE,
        "environment": {
            **git_state(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "frameworks": framework_versions(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "elapsed_s": round(time.time() - started, 1),
        },
        "runs": _rounded(records),
    }
    if len(records) > 1:  # same start, same batches: how far apart the frameworks' curves drift
        curves = np.array([r["losses"] for r in records])  # (frameworks, steps)
        doc["max_loss_difference"] = _rounded(float(np.max(curves.max(0) - curves.min(0))))
    return doc


def main(argv: list[str] | None = None) -> int:
    prog = "python -m attnspec.bench.copy_task"
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="reports/results/copy_task.json")
    ap.add_argument(
        "--framework",
        action="append",
        choices=FRAMEWORKS,
        help="train with these only (repeatable); default: each one installed",
    )
    ap.add_argument("--steps", type=int, default=Settings.steps)
    args = ap.parse_args(argv)
    frameworks = tuple(args.framework or [f for f in FRAMEWORKS if importlib.util.find_spec(f)])
    if not frameworks:
        print(f"{prog}: neither torch nor jax is installed", file=sys.stderr)
        return 2
    doc = run(frameworks, Settings(steps=args.steps))
    write_json_atomic(args.out, doc)
    for r in doc["runs"]:
        b, a = r["before"], r["after"]
        print(
            f"{r['framework']:>5} {r['version']}: held-out loss {b['loss']:.3g} -> {a['loss']:.3g}, "
            f"accuracy {b['accuracy']:.3f} -> {a['accuracy']:.3f}, diagonal mass "
            f"{b['diagonal_mass']:.3f} -> {a['diagonal_mass']:.3f}, {r['wall_s']:.2f} s "
            f"for {len(r['losses'])} steps"
        )
    print(f"wrote {args.out}; `nox -s report` (python -m attnspec.reports) draws its figure")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
