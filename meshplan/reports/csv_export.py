"""CSV: one row per configuration with every plan field and predicted / measured figure, flattened."""

from __future__ import annotations

import pandas as pd

from meshplan.reports.inputs import Config
from meshplan.reports.tables import flatten_config


def configs_frame(configs: list[Config]) -> pd.DataFrame:
    return pd.DataFrame([flatten_config(c) for c in configs])


def render_csv(configs: list[Config]) -> str:
    return configs_frame(configs).to_csv(index=False)
