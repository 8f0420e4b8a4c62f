"""The certificate-noise study: the fit it starts from is the sst suite's without
the cool-down, each drift is judged by the certificate's own rule, and the report
states what its JSON holds."""

import torch

from benchmarks.studies import certificate_noise
from benchmarks.suites.sst import DEFAULTS
from captum_diffmask import CertificateTolerances


def test_the_fit_measured_is_the_suites_without_its_cool_down():
    config = certificate_noise.plateau_config("somewhere")
    assert DEFAULTS["diffmask"]["convergence"]["cooldown"] == certificate_noise.STEPS
    assert "convergence" not in config["diffmask"] and "convergence" in DEFAULTS["diffmask"]
    rest = {k: v for k, v in DEFAULTS["diffmask"].items() if k != "convergence"}
    assert config["diffmask"] == rest and config["data_dir"] == "somewhere"


def _figures(masked, kl, keep):
    return {"masked": masked, "kl": kl, "keep": torch.tensor(keep)}


def test_a_drift_is_judged_by_the_certificates_tolerances():
    tolerances = CertificateTolerances()
    before = _figures(0.20, 0.0100, [1.0, 1.0, 0.0, 0.0, 1.0])
    flipped = _figures(0.40, 0.0110, [1.0, 0.0, 0.0, 0.0, 1.0])  # one position of five closed
    row = certificate_noise.drift_row(before, flipped, tolerances, eps=0.01)
    assert abs(row["masked_change"] - 0.2) < 1e-12
    assert abs(row["keep_change"] - 0.2) < 1e-6 and abs(row["flipped"] - 0.2) < 1e-6
    assert not row["within"] and len(row["reasons"]) == 2  # the masked share and the keep probabilities
    still = certificate_noise.drift_row(before, _figures(0.21, 0.0120, [1.0, 0.9, 0.0, 0.1, 1.0]), tolerances, 0.01)
    assert still["within"] and still["flipped"] == 0.0 and abs(still["keep_change"] - 0.04) < 1e-6


def _row(masked, keep, within):
    return {"masked_change": masked, "keep_change": keep, "flipped": keep / 2, "kl_change": 0.001, "within": within,
            "reasons": []}


def _layer(counted, reasons=()):
    return {"masked_before": 0.2, "masked_after": 0.21, "keep_change": 0.01, "kl_before": 0.009, "kl_after": 0.0095,
            "counted": counted, "reasons": list(reasons)}


def test_a_certificates_layers_read_as_drift_rows():
    rows = certificate_noise.certificate_rows({"layers": {"3": _layer(False, ["the masked share moved"])}})
    assert abs(rows["3"]["masked_change"] - 0.01) < 1e-12 and abs(rows["3"]["kl_change"] - 0.0005) < 1e-12
    assert rows["3"]["keep_change"] == 0.01 and rows["3"]["within"] is False
    assert rows["3"]["reasons"] == ["the masked share moved"]


def _result(going_on_counted):
    depths = ["0", "1"]
    labels = ["fit -> fresh 1", "fit -> fresh 2", "fresh 1 <-> fresh 2", "fit -> cooldown"]
    drifts = {label: {k: _row(0.05 * (i + 1), 0.06, False) for k in depths} for i, label in enumerate(labels)}
    drifts["fit -> cooldown"]["0"] = _row(0.01, 0.02, True)
    going_on = {"layers": {k: _layer(int(k) in going_on_counted, [] if int(k) in going_on_counted else ["moved"])
                           for k in depths}, "counted": going_on_counted, "eps": 0.01}
    drifts["fit -> going on"] = certificate_noise.certificate_rows(going_on)
    cooled = {"layers": {"0": _layer(True), "1": _layer(False, ["the fit's verdict is unsettled"])}, "counted": [0],
              "eps": 0.01}
    return {"drifts": drifts, "going_on": going_on, "certificate": cooled,
            "tolerances": {"masked_share": 0.02, "keep": 0.05, "tol_kl": 0.25}, "eps": 0.01, "steps": 500,
            "seeds": certificate_noise.SEEDS, "fit_steps": 1900, "cooled_steps": 2400, "fit_rates": 3e-3,
            "cooldown_factor": 0.1, "verdicts": {"0": "converged", "1": "converged"}, "seconds": {"fresh 1": 600.0},
            "threads": 2, "started_utc": "2026-11-30T00:00:00+00:00"}


def test_the_report_states_its_json():
    text = certificate_noise.markdown(_result([0, 1]), "python -m benchmarks study certificate-noise --markdown x.md")
    assert ("**Going on from its fit's state at the fit's rates the certificate counts 2 of 2 depths; with fresh "
            "optimiser states 0 and 0 of 2 stay within its tolerances; after a 500-step cool-down at 0.1 x the rates "
            "1 of 2 count**") in text
    assert "fit -> cooldown 1 of 2" in text and "fresh 1 <-> fresh 2 0 of 2" in text and "fit -> going on 2 of 2" in text
    assert "the certificate counts **2 of 2** depths (0, 1). More depths stay put going on" in text
    assert "the certificate going on from its end counts **1 of 2** depths (0)" in text
    assert "up to 0.150 apart in masked share" in text
    assert ("- Depth 1 does not count after the cool-down: its masked share moved by +0.200 in the cool-down and "
            "+0.010 in the certificate, the same way in both") in text and "Depth 0 does not count" not in text
    assert "| 1 | 0.200 -> 0.210 | 0.010 | 0.0090 -> 0.0095 | no: the fit's verdict is unsettled |" in text
    assert "the probe's 0.003 -> 0.0003" in text and "(2400 steps in all)" in text


def test_the_report_says_when_going_on_moves_as_far_as_a_restart():
    text = certificate_noise.markdown(_result([]), "cmd")
    assert "the certificate counts **0 of 2** depths (none). No more depths stay put going on" in text
    assert "More depths stay put" not in text
