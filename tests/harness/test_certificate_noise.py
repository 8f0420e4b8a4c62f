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


def test_the_report_states_its_json():
    depths = ["0", "1"]
    drifts = {label: {k: _row(0.05 * (i + 1), 0.06, False) for k in depths}
              for i, label in enumerate(["fit -> rates 1", "fit -> rates 2", "rates 1 <-> rates 2", "fit -> cooldown"])}
    drifts["fit -> cooldown"]["0"] = _row(0.01, 0.02, True)
    layer = {"masked_before": 0.2, "masked_after": 0.21, "keep_change": 0.01, "kl_before": 0.009, "kl_after": 0.0095,
             "counted": True, "reasons": []}
    result = {"drifts": drifts, "certificate": {"layers": {"0": layer, "1": {**layer, "counted": False,
                                                                             "reasons": ["the fit's verdict is unsettled"]}},
                                                "counted": [0], "eps": 0.01},
              "tolerances": {"masked_share": 0.02, "keep": 0.05, "tol_kl": 0.25}, "eps": 0.01, "steps": 500,
              "seeds": certificate_noise.SEEDS, "fit_steps": 1900, "fit_rates": 3e-3,
              "cooled_rates": {"lr": 3e-4, "lr_baseline": 1e-4, "lr_lambda": 1e-3},
              "verdicts": {"0": "converged", "1": "converged"}, "seconds": {"rates 1": 600.0}, "threads": 2,
              "started_utc": "2026-11-30T00:00:00+00:00"}
    text = certificate_noise.markdown(result, "python -m benchmarks study certificate-noise --markdown x.md")
    assert "**After a 500-step cool-down at 0.1 x the rates the certificate counts 1 of 2 depths; at the fit's " \
        "rates two continuations of one probe lie apart past its tolerances at 2 of 2**" in text
    assert "fit -> cooldown 1 of 2" in text and "rates 1 <-> rates 2 0 of 2" in text
    assert "counts **1 of 2** depths (0)" in text and "up to 0.150 in masked share" in text
    assert ("- Depth 1 does not count: its masked share moved by +0.200 in the cool-down and +0.010 in the "
            "certificate, the same way in both") in text and "Depth 0 does not count" not in text
    assert "| 1 | 0.200 -> 0.210 | 0.010 | 0.0090 -> 0.0095 | no: the fit's verdict is unsettled |" in text
    assert "the probe's rates 0.003 -> 0.0003" in text and "likewise times 0.1" in text
