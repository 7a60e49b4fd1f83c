"""The attention functions of the tutorials attnspec grew out of (``shared/seeds``), as a
student writes them: ``fn(Q, K, V, mask=None) -> (output, weights)`` on torch tensors, mask
1/True = keep, scale 1/sqrt(dk). Check one with

    attnspec check examples/tutorial/seed_attention.py:fill_neg_1e9_nan_to_num --convention tutorial

Each is wrong in its own way; the README shows what ``attnspec check`` says about each.
"""

import math

import torch
import torch.nn.functional as F


def fill_neg_1e9_nan_to_num(Q, K, V, mask=None):
    """Seed 003: masked logits become -1e9, then NaN weights become 0."""
    scores = Q @ K.transpose(-2, -1) / math.sqrt(K.size(-1))  # (..., n, m)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    weights = torch.nan_to_num(F.softmax(scores, dim=-1))
    return weights @ V, weights


def fill_neg_inf(Q, K, V, mask=None):
    """Seeds 000 and 001: masked logits become -inf."""
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))  # (..., n, m)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, float("-inf"))
    weights = F.softmax(scores, dim=-1)
    return weights @ V, weights


def fill_neg_1e9(Q, K, V, mask=None):
    """Seed 004: masked logits become -1e9, nothing else."""
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))  # (..., n, m)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    weights = F.softmax(scores, dim=-1)
    return weights @ V, weights
