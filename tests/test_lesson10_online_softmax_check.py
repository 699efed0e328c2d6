"""Exercise 10.3's check, fed a right answer and the typical wrong ones: it
passes the online softmax (and saves it as the trainer's flash_attention_forward
piece), names a missing rescale or mask, and refuses a (T x T) implementation."""
from __future__ import annotations

import numpy as np
import pytest

from coursework import ExerciseError, lesson10
from coursework.pieces import load_piece


def _heads(qkv, n_head):
    B, T, C3 = qkv.shape
    C = C3 // 3
    return [qkv[..., i * C:(i + 1) * C].reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)
            for i in range(3)]


def _online(qkv, n_head, tile=16, rescale_output=True, mask=True, rescale_sum=True):
    q, k, v = _heads(qkv, n_head)
    B, H, T, hs = q.shape
    out, lse = np.empty((B, H, T, hs)), np.empty((B, H, T))
    for i0 in range(0, T, tile):
        rows = np.arange(i0, min(i0 + tile, T))
        qi = q[:, :, rows] / np.sqrt(hs)
        m, l, acc = np.full(qi.shape[:-1], -np.inf), np.zeros(qi.shape[:-1]), np.zeros(qi.shape)
        for j0 in range(0, rows[-1] + 1, tile):
            cols = np.arange(j0, min(j0 + tile, T))
            s = qi @ k[:, :, cols].transpose(0, 1, 3, 2)
            if mask:
                s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)
            m_new = np.maximum(m, s.max(-1))
            p = np.exp(s - m_new[..., None])
            l = (l * np.exp(m - m_new) if rescale_sum else l) + p.sum(-1)
            acc = (acc * np.exp(m - m_new)[..., None] if rescale_output else acc) \
                + p @ v[:, :, cols]
            m = m_new
        out[:, :, rows], lse[:, :, rows] = acc / l[..., None], m + np.log(l)
    return out.transpose(0, 2, 1, 3).reshape(B, T, H * hs), lse


def online_right(qkv, n_head, tile=16):
    """Self-contained, as a learner's piece must be (it is saved and reloaded alone)."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, T, n_head, C // n_head)
               .transpose(0, 2, 1, 3) for i in range(3))
    out, lse = np.empty(q.shape), np.empty(q.shape[:-1])
    for i0 in range(0, T, tile):
        rows = np.arange(i0, min(i0 + tile, T))
        qi = q[:, :, rows] / np.sqrt(C // n_head)
        m, l, acc = np.full(qi.shape[:-1], -np.inf), np.zeros(qi.shape[:-1]), np.zeros(qi.shape)
        for j0 in range(0, rows[-1] + 1, tile):
            cols = np.arange(j0, min(j0 + tile, T))
            s = np.where(cols[None, :] <= rows[:, None],
                         qi @ k[:, :, cols].transpose(0, 1, 3, 2), -np.inf)
            m_new = np.maximum(m, s.max(-1))
            p = np.exp(s - m_new[..., None])
            l = l * np.exp(m - m_new) + p.sum(-1)
            acc = acc * np.exp(m - m_new)[..., None] + p @ v[:, :, cols]
            m = m_new
        out[:, :, rows], lse[:, :, rows] = acc / l[..., None], m + np.log(l)
    return out.transpose(0, 2, 1, 3).reshape(B, T, C), lse


def online_without_rescale(qkv, n_head, tile=16):
    return _online(qkv, n_head, tile, rescale_output=False)


def online_without_mask(qkv, n_head, tile=16):
    return _online(qkv, n_head, tile, mask=False)


def online_without_sum_rescale(qkv, n_head, tile=16):
    return _online(qkv, n_head, tile, rescale_sum=False)


def online_lse_without_max(qkv, n_head, tile=16):
    out, lse = online_right(qkv, n_head, tile)
    return out, np.log(np.exp(lse - lse.max(-1, keepdims=True)))


def full_matrix(qkv, n_head, tile=16):
    return lesson10.attention_reference(qkv, n_head)


def _fails_with(fn, phrase):
    with pytest.raises(ExerciseError) as info:
        lesson10.check_online_softmax(fn)
    assert str(info.value).startswith("Exercise 10.3") and phrase in str(info.value)


def test_right_answer_passes_and_becomes_the_trainers_piece():
    lesson10.check_online_softmax(online_right)
    piece = load_piece("flash_attention_forward")
    qkv = np.random.default_rng(0).normal(size=(1, 9, 12))
    out, lse = piece(qkv, 2)
    want_out, want_lse = lesson10.attention_reference(qkv, 2)
    assert np.allclose(out, want_out) and np.allclose(lse, want_lse)


def test_hints_name_the_slip_without_the_update_rule():
    for fn in (online_without_rescale, online_without_sum_rescale, online_lse_without_max):
        with pytest.raises(ExerciseError) as info:
            lesson10.check_online_softmax(fn)
        assert "exp(m - m')" not in str(info.value) and "m + log(l)" not in str(info.value)


def test_typical_mistakes_are_named():
    _fails_with(online_without_rescale, "the output accumulated so far is still weighted for "
                                        "the old maximum")
    _fails_with(online_without_mask, "row 0 attends to key 0 alone")
    _fails_with(online_without_sum_rescale, "the running sum and the running output were "
                                            "accumulated for the old maximum")
    _fails_with(online_without_sum_rescale, "is the first wrong one")
    _fails_with(full_matrix, "(T x T) matrix")
    _fails_with(online_lse_without_max, "needs that maximum back in lse")

    def stub(qkv, n_head, tile=16):
        raise NotImplementedError()
    _fails_with(stub, "not done yet")
