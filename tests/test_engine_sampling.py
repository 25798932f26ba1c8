"""Sampling under DFlash is exact in distribution: seeded samples of the first generated tokens
from DFlash and from plain sampling pass a chi-square homogeneity test (deterministic given the
seeds), at two temperatures, with top-p, top-k and a repetition penalty. The same test rejects a
sampler that ignores the temperature, so it can fail."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from engine_fixtures import OracleDrafter, run

from app.models.loader import load_drafter, load_target
from app.models.tiny import build_tiny_pair

N = 200
PROMPT = [1, 40, 41, 42, 43, 2, 1, 60]


@pytest.fixture(scope="module")
def peaky(tiny_root):
    """A tiny hybrid target with larger weights (peakier next-token distributions)."""
    t, d = build_tiny_pair(tiny_root / "peaky", "qwen3_5", seed=3, block_size=8, weight_scale=3.0)
    target, drafter = load_target(t), load_drafter(d)
    greedy = run(target, PROMPT, mode="plain", max_tokens=12).tokens
    oracle = OracleDrafter(greedy, len(PROMPT), target.vocab_size, 8, [1, 3], schedule=[None])
    return target, drafter, oracle


def _samples(target, drafter, mode, seed0, **kw):
    out = []
    for i in range(N):
        toks = run(target, PROMPT, drafter, mode=mode, max_tokens=4, seed=seed0 + i, **kw).tokens
        out.append(tuple(toks[1:4] + [-1] * (4 - len(toks))))  # -1: ended early
    return out


def chi2_homogeneity(a: list, b: list) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom for two samples of categories (categories
    with fewer than 10 observations in total are pooled into one)."""
    ca, cb = Counter(a), Counter(b)
    cats = set(ca) | set(cb)
    small = {c for c in cats if ca[c] + cb[c] < 10}
    rows = [(ca[c], cb[c]) for c in cats - small]
    if small:
        rows.append((sum(ca[c] for c in small), sum(cb[c] for c in small)))
    na, nb = len(a), len(b)
    stat = 0.0
    for x, y in rows:
        tot = x + y
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    return stat, max(1, len(rows) - 1)


def chi2_critical(dof: int, z: float = 3.09) -> float:
    """Upper critical value (Wilson-Hilferty approximation; z=3.09 is p=0.001)."""
    h = 2 / (9 * dof)
    return dof * (1 - h + z * math.sqrt(h)) ** 3


SETTINGS = [
    {"temperature": 0.7, "top_k": 8},
    {"temperature": 1.3, "top_p": 0.9},
    {"temperature": 1.0, "top_k": 8, "repetition_penalty": 1.5},
]


@pytest.mark.parametrize("settings", [
    pytest.param(s, marks=pytest.mark.slow) for s in SETTINGS
], ids=["t0.7-topk", "t1.3-topp", "t1.0-reppen"])  # 10-17 s each: make test runs them
def test_dflash_sampling_matches_plain_sampling(peaky, settings):
    target, _, oracle = peaky
    plain = _samples(target, None, "plain", 0, **settings)
    spec = _samples(target, oracle, "dflash", 100_000, **settings)
    assert len(set(plain)) > 3  # the test sees a real distribution, not a point mass
    for pos in (0, 1, 2):
        stat, dof = chi2_homogeneity([s[pos] for s in plain], [s[pos] for s in spec])
        assert stat < chi2_critical(dof), f"position {pos + 1}: chi2 {stat:.1f}, dof {dof}"
    stat, dof = chi2_homogeneity([s[:2] for s in plain], [s[:2] for s in spec])
    assert stat < chi2_critical(dof), f"joint: chi2 {stat:.1f}, dof {dof}"


@pytest.mark.slow
def test_the_check_rejects_a_sampler_that_ignores_temperature(peaky):
    target, _, oracle = peaky
    plain = _samples(target, None, "plain", 0, temperature=1.3, top_p=0.9)
    wrong = _samples(target, oracle, "dflash", 100_000, temperature=0.3, top_p=0.9)
    stat, dof = chi2_homogeneity([s[1] for s in plain], [s[1] for s in wrong])
    assert stat > chi2_critical(dof)


def test_seed_makes_a_sampled_run_reproducible(peaky):
    target, drafter, _ = peaky
    kw = {"temperature": 1.0, "max_tokens": 24, "seed": 7}
    assert run(target, PROMPT, mode="plain", **kw).tokens == run(
        target, PROMPT, mode="plain", **kw
    ).tokens
    a = run(target, PROMPT, drafter, mode="dflash", **kw)
    b = run(target, PROMPT, drafter, mode="dflash", **kw)
    assert a.tokens == b.tokens and a.summary.cycles > 0


def test_greedy_with_repetition_penalty_stays_exact(peaky):
    target, drafter, _ = peaky
    kw = {"max_tokens": 32, "repetition_penalty": 1.3}
    plain = run(target, PROMPT, mode="plain", **kw).tokens
    assert run(target, PROMPT, drafter, mode="dflash", **kw).tokens == plain
