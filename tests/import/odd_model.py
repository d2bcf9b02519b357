"""A user's own model (scripts/export_model.py --module odd_model:build) with operators the
analytic profile has no formula for (cumsum, logsumexp): the import tests check that they are
measured and named in the profile's notes."""
import torch


class Odd(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(12, 12)
        self.outer = torch.nn.Linear(12, 6)

    def forward(self, x):
        h = torch.cumsum(self.inner(x), dim=-1)
        return torch.logsumexp(self.outer(h), dim=-1)


def build():
    return Odd(), {"x": torch.randn(3, 12)}, lambda out, batch: out.mean()
