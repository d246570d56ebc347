"""A Bradley–Terry reward over score columns, fitted on pairwise listener votes.

Each decisive vote compares two takes of one group: ``left`` and ``right``, with features ``x``
(the standardised score columns). The model says the listener chose left with probability
``sigmoid(b + w · (x_left − x_right))``: ``w`` is the reward (a weight per column, the same for
every take, so it ranks the takes of a group), ``b`` the listener's lean to the left side (a
position bias, no part of the reward). ``w`` carries an L2 penalty (the votes are few beside the
columns), ``b`` none. It is a logistic regression on feature differences, solved by Newton's
method: the loss is convex and the problem small (votes × columns).

Held-out agreement: the votes are split into folds by group (every vote on a group falls in one
fold, so votes of several listeners on one pair never straddle train and test), each fold is
predicted by a fit on the others. A prediction agrees when the higher-rewarded take is the one
chosen; a tie counts half.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bestofn.report.votes import share_interval
from bestofn.select.trust import BOOTSTRAP_RESAMPLES, seeded_rng

NEWTON_STEPS = 50
NEWTON_TOLERANCE = 1e-10


@dataclass
class Fit:
    weights: np.ndarray  # one per feature column (standardised units)
    left_bias: float  # the intercept: log-odds of choosing the left take at equal reward


def fit(diffs: np.ndarray, chose_left: np.ndarray, l2: float) -> Fit:
    """Penalised maximum likelihood of the model above. ``diffs``: (votes, columns) of
    ``x_left − x_right``; ``chose_left``: 0/1 per vote."""
    n, k = diffs.shape
    design = np.hstack([np.ones((n, 1)), diffs])
    penalty = np.full(k + 1, float(l2))
    penalty[0] = 0.0  # the position bias is not shrunk
    theta = np.zeros(k + 1)
    y = chose_left.astype(float)
    for _ in range(NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-(design @ theta)))
        grad = design.T @ (p - y) + penalty * theta
        hess = (design * (p * (1 - p))[:, None]).T @ design + np.diag(penalty)
        # a tiny ridge keeps the intercept's step defined when every vote went one way
        step = np.linalg.solve(hess + 1e-9 * np.eye(k + 1), grad)
        theta -= step
        if float(np.max(np.abs(step))) < NEWTON_TOLERANCE:
            break
    return Fit(weights=theta[1:], left_bias=float(theta[0]))


def agreement_hits(margin: np.ndarray, chose_left: np.ndarray) -> np.ndarray:
    """Per vote, 1 where the left-minus-right ``margin`` of a reward points to the chosen take,
    0 where it points away, 0.5 on a tie or where the reward is missing (NaN)."""
    hits = np.where(margin > 0, chose_left, 1.0 - chose_left).astype(float)
    return np.where((margin == 0) | ~np.isfinite(margin), 0.5, hits)


def group_folds(groups: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """A fold number per vote: the distinct groups shuffled (seeded) and dealt round the
    ``folds`` (at most one fold per group)."""
    unique = np.unique(groups)
    order = seeded_rng(seed, "reward-fit", "folds").permutation(len(unique))
    fold_of = {unique[i]: n % folds for n, i in enumerate(order)}
    return np.array([fold_of[g] for g in groups])


def cross_validate(
    diffs: np.ndarray, chose_left: np.ndarray, groups: np.ndarray, folds: int, l2: float,
    seed: int,
) -> np.ndarray:  # fmt: skip
    """Held-out reward margins (left − right) per vote: each fold predicted by a fit on the
    other folds."""
    fold = group_folds(groups, folds, seed)
    margin = np.zeros(len(chose_left))
    for f in np.unique(fold):
        test = fold == f
        model = fit(diffs[~test], chose_left[~test], l2)
        margin[test] = diffs[test] @ model.weights
    return margin


@dataclass
class Share:
    share: float
    lo: float
    hi: float


def share(hits: np.ndarray, groups: np.ndarray, seed: int, *key) -> Share:
    """A share with the votes tables' interval: a bootstrap over groups, never narrower than
    Wilson's (bestofn.report.votes.share_interval)."""
    s, lo, hi = share_interval(hits, groups, seeded_rng(seed, "reward-fit", *key))
    return Share(s, lo, hi)


def paired_difference(fitted: np.ndarray, hand: np.ndarray, groups: np.ndarray, seed: int) -> Share:
    """Mean of ``fitted − hand`` agreement per vote, with a 95 % bootstrap interval over
    groups (the same resampled groups for both, so their shared noise cancels)."""
    d = fitted - hand
    _, inverse = np.unique(groups, return_inverse=True)
    sums = np.bincount(inverse, weights=d)
    counts = np.bincount(inverse).astype(float)
    mean = float(d.mean()) if len(d) else float("nan")
    if len(counts) < 2:
        return Share(mean, float("nan"), float("nan"))
    rng = seeded_rng(seed, "reward-fit", "difference")
    pick = rng.integers(0, len(counts), (BOOTSTRAP_RESAMPLES, len(counts)))
    means = sums[pick].sum(axis=1) / counts[pick].sum(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return Share(mean, float(lo), float(hi))
