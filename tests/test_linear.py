"""The linear forms of cost.py's ops (mlactl/model/linear.py), which the replay prices steps
with: a path that is not linear in its rows is refused."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mlactl.model.config import from_name
from mlactl.model.cost import CostModel
from mlactl.model.linear import LinearOps
from mlactl.util.errors import MlactlError


def test_linear_forms_refuse_a_path_that_is_not_linear(monkeypatch):
    cost = CostModel(from_name("deepseek-v3"))
    real = CostModel.ops

    def squared(self, path, batch, new, prefix):  # an op growing with new**2 per row: no linear form
        ops = real(self, path, batch, new, prefix)
        op = ops[0]
        return [replace(op, flops=op.flops + np.asarray(new, dtype=np.float64) ** 2)] + ops[1:]

    monkeypatch.setattr(CostModel, "ops", squared)
    with pytest.raises(MlactlError, match="is not linear"):
        LinearOps(cost, "absorb")
