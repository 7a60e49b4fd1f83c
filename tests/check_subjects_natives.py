"""Three frameworks' own attention as a new user checks them (issue #19): MLX, tinygrad and
Keras on JAX, called through the atlas' conventions, with none of their declared deviations
(``deviations_of`` cleared), so every difference from the spec is a plain failure whose message
must name its cause. Loaded by path: ``attnspec check check_subjects_natives:mlx``."""

from attnspec.backends.atlas import natives


def _undeclared(backend):
    backend.deviations_of = None  # the atlas entries would count these failures as declared
    return backend


def mlx():
    return _undeclared(natives.mlx_native())


def tinygrad():
    return _undeclared(natives.tinygrad_native())


def keras_jax():
    return _undeclared(natives.keras_jax_native())
