"""Gate parsing and checking."""

from __future__ import annotations

import pytest

from ctrctl.errors import ConfigError, GateError
from ctrctl.evaluation.gates import Gate, check_gates, parse_gate, parse_gates, raise_for_failures


@pytest.mark.parametrize(
    ("text", "gate"),
    [
        ("auc>=0.70", Gate("auc", ">=", 0.70)),
        (" logloss < 0.45 ", Gate("logloss", "<", 0.45)),
        ("ne<=1", Gate("ne", "<=", 1.0)),
        ("pr_auc>.1", Gate("pr_auc", ">", 0.1)),
        ("calibration=1.0+-0.05", Gate("calibration", "=", 1.0, 0.05)),
        ("calibration==1±5e-2", Gate("calibration", "=", 1.0, 0.05)),
    ],
)
def test_parse(text: str, gate: Gate) -> None:
    assert parse_gate(text) == gate


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("auc>=", "malformed"),
        ("auc=>0.7", "malformed"),
        ("auc 0.7", "malformed"),
        ("acu>=0.7", "unknown metric 'acu'"),
        ("calibration=1.0", "without a tolerance"),
        ("auc>=0.7+-0.1", "tolerance goes only"),
    ],
)
def test_malformed_or_unknown_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_gate(text)


def test_check_reports_margins() -> None:
    gates = parse_gates(["auc>=0.7", "auc>0.75", "calibration=1+-0.05", "logloss<0.5",
                         "ece<=0.01"])
    results = check_gates(gates, {"auc": 0.72, "calibration": 1.08, "logloss": 0.44,
                                  "ece": None})
    assert [r.passed for r in results] == [True, False, False, True, False]
    assert results[1].margin == pytest.approx(-0.03)
    assert results[2].margin == pytest.approx(-0.03)
    with pytest.raises(GateError, match="3 gate") as info:
        raise_for_failures(results)
    text = str(info.value)
    assert "auc>0.75: FAILED, auc=0.72 (missed by 0.03)" in text
    assert "ece is undefined" in text
    assert info.value.exit_code == 3
    raise_for_failures(results[:1])  # all passed: no error


def test_gates_from_a_pipeline_config_mapping() -> None:
    from ctrctl.evaluation.gates import gates_from_mapping

    assert gates_from_mapping({"auc": 0.7, "logloss": 0.5, "calibration": "=1+-0.05"}) == (
        Gate("auc", ">=", 0.7), Gate("logloss", "<=", 0.5), Gate("calibration", "=", 1.0, 0.05)
    )
    with pytest.raises(ConfigError, match="which way"):
        gates_from_mapping({"calibration": 1.0})
    with pytest.raises(ConfigError, match="unknown metric"):
        gates_from_mapping({"acu": 0.7})
