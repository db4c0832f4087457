"""Forecast the seams study's speed at device counts this machine cannot reach.

Design. A step of either arm on N devices is a set of compute actions on ranks and messages
between them. The compute costs are measured here, once per segment shape and rows
(`costs.measure_costs`: forward, the backward split into its input- and weight-gradient parts,
the aux head, the optimizer, with FLOPs beside every time); the messages are charged by a link
model (`links`: latency + bytes / bandwidth; measured loopback gloo, or published NVLink and
InfiniBand figures). The order of the actions is not modelled: for a pipe schedule each rank's
order is read from the torch.distributed.pipelining class the e2e arm runs, and `replay` plays
it as a discrete-event simulation (an action starts when its rank is free and its inputs have
arrived). `study.forecast` does that for every placement of both arms at every N (single, dp,
each pipe schedule with its default micro-batches; single and stages for local), marks the
fastest e2e one, `study.validate` compares it with measured runs, and `study.time_to_target`
turns held-out loss-vs-steps curves into forecast seconds to a target loss and a break-even N.
`measured` reads what real runs measured (a seams report's placement candidates and its
held-out curves) and checks the forecast against it (`validate_report`); `figures` draws a
forecast report.

Layout: `candidates` (what runs where, and why a placement cannot be forecast), `costs`,
`links`, `replay`, `study`, `measured`, `figures`. docs/forecast.md says what is and is not modelled.
"""

from seamkit.forecast.costs import CostError, load_costs, measure_costs, save_costs
from seamkit.forecast.figures import (
    forecast_figures,
    time_to_target_figure,
    tokens_figure,
)
from seamkit.forecast.links import LOOPBACK, PRESETS, Link, measure_loopback, parse_link
from seamkit.forecast.measured import (
    curves_from_report,
    forecast_lines,
    forecast_seams,
    measured_speeds,
    validate_report,
    validation_lines,
)
from seamkit.forecast.replay import ReplayError, replay, replay_local, torch_order
from seamkit.forecast.study import (
    ForecastError,
    forecast,
    parse_devices,
    time_to_target,
    validate,
)

__all__ = ["CostError", "ForecastError", "LOOPBACK", "Link", "PRESETS", "ReplayError", "curves_from_report",
           "forecast", "forecast_figures", "forecast_lines", "forecast_seams", "load_costs", "measure_costs", "measure_loopback",
           "measured_speeds", "parse_devices", "parse_link", "replay", "replay_local", "save_costs",
           "time_to_target", "time_to_target_figure", "tokens_figure", "torch_order", "validate", "validate_report",
           "validation_lines"]
