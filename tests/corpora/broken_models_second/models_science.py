"""Scientific and probabilistic models of the second corpus: a lat-lon weather grid with a
latitude-weighted loss, a neural ODE (RK4), a mixture density network and a VAE. Each twin is
written first; the broken part is marked ``# BUG(case)``. Three of the bugs are in the loss."""

import math

import torch
import torch.nn as nn


# --- weather: a global lat-lon grid, loss weighted by cos(latitude) ---------------------------
LATITUDES = torch.linspace(-84.375, 84.375, 16)  # cell centres, south to north (the grid's rows)


def latitude_weights():
    w = torch.cos(torch.deg2rad(LATITUDES))
    return w / w.mean()


class GridForecaster(nn.Module):
    """(B, vars, lat, lon) -> the next step, wrapping around in longitude."""

    def __init__(self, variables=3, c=16):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(variables, c, 3, padding=(1, 0)), nn.GELU(), nn.Conv2d(c, variables, 1))

    def forward(self, x):
        return x + self.net(torch.cat([x[..., -1:], x, x[..., :1]], dim=-1))


def weather_loss_twin(pred, target):
    w = latitude_weights()[:, None]  # (lat, 1): one weight per row
    return ((pred - target) ** 2 * w).mean()


def weather_loss_broken(pred, target):
    w = latitude_weights()  # BUG(weather_lat_weights)
    return ((pred - target) ** 2 * w).mean()


# --- physics: a neural ODE dy/dt = f(t, y), integrated with RK4 -------------------------------
class NeuralODETwin(nn.Module):
    def __init__(self, d=4, hidden=32, steps=8):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(d + 1, hidden), nn.Tanh(), nn.Linear(hidden, d))
        self.steps = steps

    def field(self, t, y):
        return self.f(torch.cat([y, t.expand(y.shape[0], 1)], dim=-1))

    def forward(self, y0):
        t, dt, y = torch.zeros(()), 1.0 / self.steps, y0
        for _ in range(self.steps):
            k1 = self.field(t, y)
            k2 = self.field(t + dt / 2, y + dt / 2 * k1)
            k3 = self.field(t + dt / 2, y + dt / 2 * k2)
            k4 = self.field(t + dt, y + dt * k3)
            y, t = y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4), t + dt
        return y


class NeuralODEBroken(NeuralODETwin):
    def field(self, t, y):
        return self.f(torch.cat([y, t], dim=-1))  # BUG(ode_time_scalar_cat)


# --- mixture density network: K Gaussians per input ------------------------------------------
class MDN(nn.Module):
    def __init__(self, d_in=3, k=5, d_out=2, hidden=32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh())
        self.pi, self.mu, self.log_sigma = nn.Linear(hidden, k), nn.Linear(hidden, k * d_out), nn.Linear(hidden, k * d_out)
        self.k, self.d_out = k, d_out

    def forward(self, x):
        h, b = self.body(x), x.shape[0]
        return (self.pi(h).log_softmax(-1), self.mu(h).view(b, self.k, self.d_out),
                self.log_sigma(h).view(b, self.k, self.d_out).clamp(-5, 5))


def mdn_nll_twin(out, y):
    log_pi, mu, log_sigma = out  # (B, K), (B, K, D), (B, K, D); y: (B, D)
    z = (y[:, None, :] - mu) / log_sigma.exp()
    log_comp = (-0.5 * z ** 2 - log_sigma - 0.5 * math.log(2 * math.pi)).sum(-1)  # (B, K)
    return -torch.logsumexp(log_pi + log_comp, dim=-1).mean()


def mdn_nll_broken(out, y):
    log_pi, mu, log_sigma = out
    z = (y - mu) / log_sigma.exp()  # BUG(mdn_target_component_axis)
    log_comp = (-0.5 * z ** 2 - log_sigma - 0.5 * math.log(2 * math.pi)).sum(-1)
    return -torch.logsumexp(log_pi + log_comp, dim=-1).mean()


# --- VAE: reconstruction per sample plus the KL term per sample -------------------------------
class VAE(nn.Module):
    def __init__(self, d=20, z=6, hidden=32):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, hidden), nn.ReLU())
        self.mu, self.logvar = nn.Linear(hidden, z), nn.Linear(hidden, z)
        self.dec = nn.Sequential(nn.Linear(z, hidden), nn.ReLU(), nn.Linear(hidden, d))

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp() if self.training else mu
        return self.dec(z), mu, logvar


def vae_loss_twin(out, x):
    recon, mu, logvar = out
    rec = ((recon - x) ** 2).sum(1)  # (B,)
    kl = -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(1)  # (B,): KL per sample
    return (rec + kl).mean()


def vae_loss_broken(out, x):
    recon, mu, logvar = out
    rec = ((recon - x) ** 2).sum(1)
    kl = -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(0)  # BUG(vae_kl_axis)
    return (rec + kl).mean()
