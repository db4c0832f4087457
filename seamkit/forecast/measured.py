"""What real runs measured, read for the forecast's check: each placement candidate's tokens/s
(`measured_speeds`), whether they may check this forecast at all (`check_validatable`), and the
check itself (`validate_report`).

A forecast is checked only against speeds of the same config, measured on this host in the run
that produced them, and only at device counts it forecasts; anything else is refused in one line
(ForecastError) instead of read as an error of the model. Measured speeds come from:
- a seams report: its `placement` block's `measured_here`, the speeds `seams.calibration`
  measured on the report's host in its run (every candidate when calibrated then; a committed
  calibration's choices re-timed; none when the placements were named, or in a report that
  predates the key). The rest of its `candidates` came from elsewhere and is left out, said so.
  Its `run_config` must match the forecast's config in every field a speed depends on
  (`seams.calibration.SPEED_FIELDS`), and its `machine` the host the costs were measured on;
- a calibration file's entries (`{"entries": [...]}`, as bench/placement.py writes them), or one
  entry (`{"devices", "tokens_per_s", ...}`): each must carry the `speed_key` of this config at
  its devices and the `machine` key and speed `fingerprint` of this host
  (`seams.calibration.speed_key`, `machine_key`, `fingerprint` within FINGERPRINT_TOL).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from seamkit.config import ConfigError, RunConfig, from_dict
from seamkit.forecast.predict import ForecastError, validate
from seamkit.report import machine
from seamkit.seams import calibration
from seamkit.seams.placement import threads_for
from seamkit.seams.policy import ARMS

HOST_KEYS = ("platform", "processor", "cpu", "cpu_flags", "cpu_count")  # of report.machine(): what names its host
NOTHING_HERE = "no speeds measured in this run"


def load_measured(path) -> dict:
    """A seams report or calibration file from JSON; ForecastError (one line) when it cannot be read."""
    if not str(path).strip():
        raise ForecastError("--validate: no path given (name a seams report or a calibration file)")
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ForecastError(f"--validate {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ForecastError(f"--validate {path} is not readable JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ForecastError(f"--validate {path}: expected a seams report or a calibration file (a JSON object)")
    return doc


# ----------------------------------------------------------------------------- reading the speeds

def _count(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1


def _speed(v) -> bool:
    """A measured tokens/s, or None (the candidate did not run or did not finish)."""
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _per_arm(speeds, where: str) -> dict:
    """{arm: {candidate: tokens/s or None}}, checked."""
    if not isinstance(speeds, dict) or not all(isinstance(v, dict) for v in speeds.values()):
        raise ForecastError(f"{where}: expected {{arm: {{candidate: tokens/s}}}}")
    bad = [a for a in speeds if a not in ARMS]
    if bad:
        raise ForecastError(f"{where}: unknown arm {bad[0]!r} (arms: {', '.join(ARMS)})")
    for a, per in speeds.items():
        for name, v in per.items():
            if not _speed(v):
                raise ForecastError(f"{where}.{a}.{name}: tokens/s must be a number or null, got {v!r}")
    return {a: dict(per) for a, per in speeds.items()}


def _placement(doc: dict) -> tuple[int, dict, dict]:
    """A seams report's placement block, checked: (its devices, every candidate's speed, those
    measured in its run)."""
    pl, where = doc["placement"], "seams report: placement"
    if not _count(pl.get("devices")):
        raise ForecastError(f"{where}.devices missing or not a positive whole number (got {pl.get('devices')!r})")
    cands = _per_arm(pl.get("candidates"), f"{where}.candidates")
    here = _per_arm(pl.get("measured_here", {}), f"{where}.measured_here")
    for a, per in here.items():
        extra = [name for name in per if name not in cands.get(a, {})]
        if extra:
            raise ForecastError(f"{where}.measured_here.{a} names {extra[0]!r}, which is none of its candidates")
    return pl["devices"], cands, here


def _entries(doc: dict) -> list[tuple[dict, str]]:
    """(entry, where) of a calibration file, or of one calibration."""
    if isinstance(doc.get("entries"), list):
        return [(e, f"entries[{i}]") for i, e in enumerate(doc["entries"])]
    if "tokens_per_s" in doc:
        return [(doc, "calibration")]
    raise ForecastError("measured speeds: no placement block, entries or tokens_per_s in the document (give a "
                        "seams report made with --devices N, or a calibration file of this host)")


def measured_speeds(doc) -> dict:
    """{"tokens_per_s": {arm: {N: {candidate: tokens/s or None}}}, "left_out": [...], "source":
    str, "devices": [N]} from any shape in the module docstring; ForecastError (one line) on
    anything else. Of a seams report, only what its run measured (`measured_here`)."""
    if not isinstance(doc, dict):
        raise ForecastError("measured speeds: expected a seams report or a calibration file (a JSON object)")
    out, left_out = {a: {} for a in ARMS}, []
    if isinstance(doc.get("placement"), dict):
        n, cands, here = _placement(doc)
        for a, per in here.items():
            out[a][n] = dict(per)
        for a, per in cands.items():
            left_out += [{"arm": a, "devices": n, "candidate": name,
                          "why": f"not measured in this run (its speed: {doc['placement'].get('source', 'elsewhere')})"}
                         for name in per if name not in here.get(a, {})]
        return {"tokens_per_s": out, "left_out": left_out, "source": "the speeds a seams report measured in its run",
                "devices": [n]}
    for entry, where in _entries(doc):
        if not isinstance(entry, dict) or not _count(entry.get("devices")):
            raise ForecastError(f"measured speeds: {where}: devices missing or not a positive whole number")
        for a, per in _per_arm(entry.get("tokens_per_s"), f"measured speeds: {where}.tokens_per_s").items():
            out[a].setdefault(entry["devices"], {}).update(per)
    devices = sorted({n for per in out.values() for n in per})
    return {"tokens_per_s": out, "left_out": [], "source": "a calibration of this host", "devices": devices}


# ----------------------------------------------------------------------------- may they check this forecast

def _fields(d: dict) -> dict:
    """The speed fields of a config dict, model's one by one."""
    out = {}
    for f in calibration.SPEED_FIELDS:
        v = d
        for key in f.split("."):
            v = v[key]
        out.update({f"{f}.{k}": x for k, x in v.items()} if isinstance(v, dict) else {f: v})
    return out


def _check_config(cfg: RunConfig, doc: dict) -> None:
    rc = doc.get("run_config")
    if not isinstance(rc, dict):
        raise ForecastError("seams report: no run_config, so nothing says which config its speeds are of")
    try:
        theirs = _fields(from_dict(rc).to_dict())
    except ConfigError as e:
        raise ForecastError(f"seams report: its run_config is not one this seamkit reads ({e})") from None
    ours = _fields(cfg.to_dict())
    for f, v in ours.items():
        if theirs.get(f) != v:
            raise ForecastError(f"seams report measured {f}={theirs.get(f)!r}, the forecast's config has {v!r}: "
                                f"a forecast is checked only against speeds of its own config")


def _check_host(doc: dict, host: dict | None) -> None:
    theirs, ours = doc.get("machine"), host if host is not None else machine()
    if not isinstance(theirs, dict):
        return  # a report that does not say where it ran: its config and devices are still checked
    for k in HOST_KEYS:
        if k in theirs and k in ours and theirs[k] != ours[k]:
            raise ForecastError(f"seams report was made on another host ({k} {theirs[k]!r}, the costs' host has "
                                f"{ours[k]!r}): a forecast is checked only against speeds of its costs' host")
    a, b = theirs.get("fingerprint"), ours.get("fingerprint")
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not calibration.same_speed(b, a):
        raise ForecastError(f"seams report was made on another host (speed fingerprint {a:.3g}, the costs' host's "
                            f"{b:.3g}, more than {calibration.FINGERPRINT_TOL:.0%} apart)")


def _check_entry(cfg: RunConfig, entry: dict, where: str, here: list) -> None:
    """A calibration entry of this config and this host, or ForecastError saying which it is not."""
    missing = [k for k in ("speed_key", "machine", "fingerprint") if k not in entry]
    if missing:
        raise ForecastError(f"{where} carries no {missing[0]}: nothing says it was measured for this config on this "
                            f"host")
    want = calibration.speed_key(cfg, entry["devices"])
    if entry["speed_key"] != want:
        raise ForecastError(f"{where} was measured for another preset or config (speed_key {entry['speed_key']}, this "
                            f"config's at N={entry['devices']} is {want})")
    key = calibration.machine_key()
    theirs = entry["machine"] if isinstance(entry["machine"], dict) else {}
    diff = next((k for k in sorted(set(key) | set(theirs)) if theirs.get(k) != key.get(k)), None)
    if diff is not None:
        raise ForecastError(f"{where} was measured on another host ({diff} {theirs.get(diff)!r}, this host's "
                            f"{key.get(diff)!r})")
    if not here:
        here.append(calibration.fingerprint())
    printed = entry["fingerprint"]
    tol = calibration.FINGERPRINT_TOL
    if not calibration.same_speed(here[0], printed):
        raise ForecastError(f"{where} was measured on another host (speed fingerprint {printed!r}, this host's "
                            f"{here[0]:.3g}, more than {tol:.0%} apart)")


def check_validatable(cfg: RunConfig, doc, devices, host: dict | None = None) -> None:
    """Whether `doc`'s speeds may check a forecast of `cfg` at `devices`; ForecastError (one line)
    naming why not (module docstring): a malformed document, a device count the forecast lacks, a
    seams report of another config (or made on another host than `host`, the costs' machine,
    default this one), a calibration entry of another config or host."""
    got = measured_speeds(doc)
    have = {int(n) for n in devices}
    for n in got["devices"]:
        if n not in have:
            raise ForecastError(f"the forecast has no N={n}, which {got['source']} measured at: forecast with devices "
                                f"including {n}")
    if isinstance(doc.get("placement"), dict):
        _check_config(cfg, doc)
        _check_host(doc, host)
        return
    here: list = []  # this host's fingerprint, measured once when an entry needs it
    for entry, where in _entries(doc):
        _check_entry(cfg, entry, f"measured speeds: {where}", here)


def measured_devices(doc) -> list[int]:
    """The device counts `doc` measured at (the forecast must include them to be checked)."""
    return measured_speeds(doc)["devices"]


# ----------------------------------------------------------------------------- the check

def _threads_measured(doc: dict, n: int, name: str) -> int | None:
    """Torch threads a process of that measured candidate had (CPU): `placement.threads_for` of
    the config it ran. None when the document does not say."""
    rc = doc.get("run_config")
    if not isinstance(rc, dict) or doc.get("device", rc.get("train", {}).get("device")) != "cpu":
        return None  # a seams report's `device` is the one it ran on; its config may say auto
    return threads_for(from_dict(rc), 1 if name == "single" else n, n)


def validate_report(forecast_report: dict, doc: dict) -> dict:
    """The forecast checked against what `doc` measured (`check_validatable` first, with the
    forecast's own config, devices and costs' host): relative error (forecast - measured) /
    measured of every candidate with a number, the worst by size, and the candidates left out with
    why (not measured in this run, did not finish, not forecast). Where nothing was measured in
    the run, no error is given and `note` says so. On CPU each row also says the threads a
    measured process had and those its forecast's costs were measured with."""
    cfg = from_dict(forecast_report["run_config"])
    check_validatable(cfg, doc, forecast_report["devices"], (forecast_report.get("cost_table") or {}).get("machine"))
    got = measured_speeds(doc)
    numbers, missing = {a: {} for a in ARMS}, list(got["left_out"])
    for a, per_n in got["tokens_per_s"].items():
        for n, cands in per_n.items():
            for name, v in cands.items():
                if v is None or not math.isfinite(v):
                    missing.append({"arm": a, "devices": n, "candidate": name,
                                    "why": "not measured (the candidate did not run or did not finish)"})
                else:
                    numbers[a].setdefault(n, {})[name] = v
    out = validate(forecast_report, numbers)
    for row in out["errors"]:
        t = _threads_measured(doc, row["devices"], row["candidate"])
        if t is not None:
            f = forecast_report["by_devices"][str(row["devices"])][row["arm"]]["candidates"][row["candidate"]]
            row.update(threads_measured=t, threads_costs=f.get("threads"))
    out["missing"] += missing
    out.update(source=got["source"], devices=got["devices"])
    if not any(numbers.values()):
        out["note"] = f"{NOTHING_HERE}: nothing to check the forecast against"
    return out


def validation_lines(v: dict) -> list[str]:
    """Each candidate's forecast, measured and error, the worst named, then what was left out."""
    lines = [f"validation against {v['source']} (N = {', '.join(map(str, v['devices']))}):"]
    if v.get("note"):
        lines.append(f"  {v['note']}")
    else:
        lines.append(f"{'N':>4}  {'arm':<6} {'candidate':<26} {'forecast':>10} {'measured':>10} {'error':>8}")
    for r in sorted(v["errors"], key=lambda r: (r["devices"], r["arm"], r["candidate"])):
        note = ""
        if r.get("threads_measured") is not None and r["threads_measured"] != r.get("threads_costs"):
            note = f"  (measured with {r['threads_measured']} threads, costs with {r.get('threads_costs')})"
        lines.append(f"{r['devices']:>4}  {r['arm']:<6} {r['candidate']:<26} {r['forecast']:>10,.0f} "
                     f"{r['measured']:>10,.0f} {r['relative_error']:>+8.1%}{note}")
    w = v["worst"]
    if not v.get("note"):
        lines.append(f"worst: {w['arm']} {w['candidate']} at N={w['devices']}, {w['relative_error']:+.1%}" if w
                     else "worst: none (no candidate both forecast and measured)")
    for m in v["missing"]:
        lines.append(f"  left out: {m['arm']} {m['candidate']} at N={m['devices']}: {m['why']}")
    return lines
