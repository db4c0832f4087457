"""Forecast the seams study's speed at device counts this machine cannot reach.

Design. A step of any arm on N devices is a set of compute actions on ranks and messages between
them. The compute costs are measured here, once per segment shape and rows (`costs.measure_costs`
over `parts`: forward, the backward split into its input- and weight-gradient parts, the aux
head, the delayed arm's stashed forward and late backward, the optimizer, with FLOPs beside every
time, each timed on the code a step runs); the messages are charged by a link model (`links`:
latency + bytes / bandwidth; measured loopback gloo, or published NVLink and InfiniBand figures).
The order of the actions is not modelled: for a pipe schedule each rank's order is read from the
torch.distributed.pipelining class the e2e arm runs, and `replay` plays it as a discrete-event
simulation (an action starts when its rank is free and its inputs have arrived).
`predict.forecast` does that for every placement of every arm at every N (the placements and
their feasibility are `seams.placement`'s, one definition for the study and the forecast), marks
the fastest one of each arm, `predict.validate` compares it with measured speeds, and
`predict.time_to_target` turns held-out loss-vs-steps curves into forecast seconds to a target
loss and a break-even N. `measured` reads what a real run measured on this host and refuses what
cannot check the forecast (another config, another host, another device count);
`seams_report` forecasts a study's report; `figures` draws a forecast report.

Layout: `candidates` (what runs where, and why a placement cannot be forecast), `table` (the
cost table's format and reading), `parts` and `costs` (measuring it), `runtime`, `shares` and
`turns` (what ranks sharing a host and torch's pipelining runtime cost), `links`, `replay`,
`steps` (one candidate's step time), `predict`, `measured`, `seams_report`, `figures`.
docs/forecast.md says what is and is not modelled.
"""

from seamkit.forecast.costs import measure_candidate, measure_costs, with_entries
from seamkit.forecast.figures import (
    forecast_figures,
    time_to_target_figure,
    tokens_figure,
)
from seamkit.forecast.links import LOOPBACK, PRESETS, Link, measure_loopback, parse_link
from seamkit.forecast.measured import (
    check_validatable,
    load_measured,
    measured_devices,
    measured_speeds,
    validate_report,
    validation_lines,
)
from seamkit.forecast.predict import (
    ForecastError,
    check_cores,
    forecast,
    parse_devices,
    summary_lines,
    time_to_target,
    validate,
)
from seamkit.forecast.replay import ReplayError, replay, replay_local, torch_order
from seamkit.forecast.seams_report import (
    curves_from_report,
    forecast_lines,
    forecast_seams,
)
from seamkit.forecast.table import CostError, load_costs, save_costs

__all__ = ["CostError", "ForecastError", "LOOPBACK", "Link", "PRESETS", "ReplayError", "check_cores",
           "check_validatable", "curves_from_report", "forecast", "forecast_figures", "forecast_lines",
           "forecast_seams", "load_costs", "load_measured", "measure_candidate", "measure_costs", "measure_loopback",
           "measured_devices", "measured_speeds", "parse_devices", "parse_link", "replay", "replay_local",
           "save_costs", "summary_lines", "time_to_target", "time_to_target_figure", "tokens_figure", "torch_order",
           "validate", "validate_report", "validation_lines", "with_entries"]
