"""Lorenz-63 and Lorenz-96 for sna.lorenz: vector fields, tangent maps (J(x) δ, for the Lyapunov estimate), RK4,
trajectories sampled every dt, and the largest Lyapunov exponents (Benettin's method), batched over [..., D].
Each function reads only the system's fields of its config, `LorenzSystem` (sna.lorenz's `LorenzConfig` has
them); jobs/sna/lorenz.py builds the data sets from them."""

from __future__ import annotations

import functools
from typing import Any, Literal, Protocol

import numpy as np

System = Literal["lorenz63", "lorenz96"]
SIGMA, RHO, BETA = 10.0, 28.0, 8.0 / 3.0
L63_LYAPUNOV = 0.906  # Sprott 2003, table A.1: (0.9056, 0, -14.5723)


class LorenzSystem(Protocol):
    """The fields of a config these functions read: which system, its size and forcing, and how it is sampled.
    A protocol, not a dataclass of ours: the task's config is the one flat dataclass its sweeps set."""

    @property
    def system(self) -> System: ...
    @property
    def dim(self) -> int: ...
    @property
    def forcing(self) -> float: ...
    @property
    def dt(self) -> float: ...
    @property
    def substeps(self) -> int: ...
    @property
    def transient(self) -> float: ...


def vector_field(cfg: LorenzSystem, x: np.ndarray) -> np.ndarray:
    if cfg.system == "lorenz63":
        a, b, c = x[..., 0], x[..., 1], x[..., 2]
        return np.stack([SIGMA * (b - a), a * (RHO - c) - b, a * b - BETA * c], axis=-1)
    ip1, im1, im2 = _ring(cfg.dim)  # dx_i/dt = (x_{i+1} - x_{i-2}) x_{i-1} - x_i + F
    return (x[..., ip1] - x[..., im2]) * x[..., im1] - x + cfg.forcing


def tangent(cfg: LorenzSystem, x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """J(x) δ for x [..., D] and tangent vectors δ [..., D, k] (columns)."""
    if cfg.system == "lorenz63":
        a, b, c = (x[..., i, None] for i in range(3))
        da, db, dc = d[..., 0, :], d[..., 1, :], d[..., 2, :]
        return np.stack([SIGMA * (db - da), da * (RHO - c) - a * dc - db, da * b + a * db - BETA * dc], axis=-2)
    ip1, im1, im2 = _ring(cfg.dim)
    xs = x[..., None]
    return (
        (d[..., ip1, :] - d[..., im2, :]) * xs[..., im1, :] + (xs[..., ip1, :] - xs[..., im2, :]) * d[..., im1, :] - d
    )


@functools.cache
def _ring(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    i = np.arange(n)
    return (i + 1) % n, (i - 1) % n, (i - 2) % n


def rk4_step(f: Any, x: Any, h: float) -> Any:
    """One classical Runge-Kutta step of dx/dt = f(x) (f maps a tuple of arrays to a tuple, or an array)."""
    if isinstance(x, tuple):
        k1 = f(x)
        k2 = f(tuple(a + h / 2 * k for a, k in zip(x, k1, strict=True)))
        k3 = f(tuple(a + h / 2 * k for a, k in zip(x, k2, strict=True)))
        k4 = f(tuple(a + h * k for a, k in zip(x, k3, strict=True)))
        return tuple(a + h / 6 * (p + 2 * q + 2 * r + s) for a, p, q, r, s in zip(x, k1, k2, k3, k4, strict=True))
    k1 = f(x)
    k2 = f(x + h / 2 * k1)
    k3 = f(x + h / 2 * k2)
    k4 = f(x + h * k3)
    return x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def initial_states(cfg: LorenzSystem, count: int, rng: np.random.Generator) -> np.ndarray:
    """Random states near the attractor, then `transient` time units integrated away: [count, D]."""
    if cfg.system == "lorenz63":
        x = rng.normal(size=(count, 3)) * 5.0 + np.array([0.0, 0.0, 25.0])
    else:
        x = cfg.forcing + rng.normal(size=(count, cfg.dim))
    return integrate(cfg, x, round(cfg.transient / cfg.dt))[:, -1]


def integrate(cfg: LorenzSystem, x0: np.ndarray, samples: int) -> np.ndarray:
    """x0 [M, D] -> trajectories [M, samples + 1, D] sampled every dt (RK4 with `substeps` steps per dt)."""
    h = cfg.dt / cfg.substeps
    out = np.empty((x0.shape[0], samples + 1, x0.shape[1]))
    out[:, 0] = x = x0
    for t in range(samples):
        for _ in range(cfg.substeps):
            x = rk4_step(lambda z: vector_field(cfg, z), x, h)
        out[:, t + 1] = x
    return out


def lyapunov_spectrum(cfg: LorenzSystem, x0: np.ndarray, span: float, k: int = 1, renorm_every: int = 10) -> np.ndarray:
    """The k largest Lyapunov exponents by Benettin's method with QR re-orthonormalisation (Benettin et al. 1980;
    Shimada & Nagashima 1979): the variational equation dδ/dt = J(x) δ is integrated with x (RK4 at dt /
    substeps), Q R = δ every `renorm_every` steps, λ_j = Σ log |R_jj| / time, averaged over the M trajectories
    of x0 [M, D] (which should already lie on the attractor)."""
    h = cfg.dt / cfg.substeps
    steps = round(span / h)
    x = x0.astype(np.float64)
    q = np.broadcast_to(np.eye(cfg.dim)[:, :k], (x.shape[0], cfg.dim, k)).copy()  # [M, D, k]
    logs = np.zeros((x.shape[0], k))

    def joint(z: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        return vector_field(cfg, z[0]), tangent(cfg, z[0], z[1])

    for s in range(1, steps + 1):
        x, q = rk4_step(joint, (x, q), h)
        if s % renorm_every == 0 or s == steps:
            q, r = np.linalg.qr(q)
            diag = np.diagonal(r, axis1=-2, axis2=-1)  # [M, k]
            logs += np.log(np.abs(diag))
            q = q * np.sign(diag)[:, None, :]  # keep the orientation, so Q stays continuous
    return logs.mean(axis=0) / (steps * h)
