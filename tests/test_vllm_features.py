"""The campaign's feature registry (flightcheck/vllm/features.py) and
`--all-features`' workloads: seeded, per release, each feature in its share."""

from __future__ import annotations

import argparse

import pytest

from flightcheck.vllm import campaign, session_generate
from flightcheck.vllm.features import FEATURE_MODULES, SHARE_RESOLUTION, features_of, registered
from flightcheck.vllm.generate import campaign_workloads
from flightcheck.vllm.workload import workload_from_json

pytestmark = pytest.mark.usefixtures("both_checkers")   # names the campaign: both checkers compared


def test_every_listed_module_defines_one_feature_with_a_sane_share() -> None:
    features = registered()
    assert len(features) >= len(FEATURE_MODULES)
    assert len({f.name for f in features}) == len(features)
    for feature in features:
        assert 0 < feature.share <= 1 and feature.versions, feature.name


def test_all_features_workloads_are_a_function_of_seed_index_and_release() -> None:
    first = campaign_workloads(7, 40, features_of="0.34.0")
    assert first == campaign_workloads(7, 40, features_of="0.34.0")
    assert all(w["name"].startswith("diff-all-0.34.0-7-") for w in first)
    plain = campaign_workloads(7, 40)
    # the features are drawn after everything else: the plain workload's requests stay
    assert [(w["config"]["num_stages"], w["config"]["block_size"], [r["id"] for r in w["requests"]])
            for w in first] == [(w["config"]["num_stages"], w["config"]["block_size"],
                                 [r["id"] for r in w["requests"]]) for w in plain]


def test_each_feature_lands_in_about_its_share_and_only_where_its_release_has_it() -> None:
    count = 400
    for version in ("0.8.5", "0.33.0", "0.34.0"):
        workloads = campaign_workloads(3, count, features_of=version)
        features = registered()
        for i, feature in enumerate(features):
            hits = sum(feature.name in w["features"] for w in workloads)
            if version not in feature.versions:
                assert hits == 0, (feature.name, version)
            else:
                # its share of the workloads that no feature applied before it excludes it from
                earlier = {f.name for f in features[:i] if feature.name in f.excludes or f.name in feature.excludes}
                open_to_it = sum(not earlier & set(w["features"]) and not _declines(feature.name, w)
                                 for w in workloads)
                expected = open_to_it * round(feature.share * SHARE_RESOLUTION) / SHARE_RESOLUTION
                assert abs(hits - expected) < 0.25 * max(open_to_it, 1), (feature.name, version, hits, open_to_it)
        assert {f.name for f in features_of(version)} >= {n for w in workloads for n in w["features"]}


def _declines(name: str, workload: dict) -> bool:
    """A feature that passes over some workloads it is drawn for (sessions
    over half a KV connector's: session_generate.declines). The features are
    drawn after the connector, so its key is already in the final config."""
    return name == "streaming-sessions" and session_generate.declines(workload)


def test_features_that_exclude_each_other_never_meet() -> None:
    features = registered()
    pairs = {(f.name, x) for f in features for x in f.excludes}
    for workload in campaign_workloads(4, 300, features_of="0.34.0"):
        names = set(workload["features"])
        assert not any(a in names and b in names for a, b in pairs), workload["features"]


@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_every_pair_of_features_meets(version: str) -> None:
    """No feature excludes another any more (docs/request-states.md,
    "Features together"): every pair a release has meets in its workloads."""
    assert not {x for f in registered() for x in f.excludes}
    workloads = campaign_workloads(4, 300, features_of=version)
    names = [f.name for f in features_of(version)]
    apart = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
             if not any(a in w["features"] and b in w["features"] for w in workloads)]
    assert not apart, apart


def test_every_generated_all_features_workload_is_a_valid_workload() -> None:
    for workload in campaign_workloads(11, 300, features_of="0.34.0") + campaign_workloads(5, 300, features_of="0.33.0"):
        workload_from_json(workload)


def test_all_features_refuses_a_family_beside_it() -> None:
    parser = argparse.ArgumentParser()
    campaign.add_options(parser)
    args = parser.parse_args(["--all-features", "--kv-connector", "--workloads", "1"])

    def error(message: str) -> None:
        raise SystemExit(message)

    with pytest.raises(SystemExit, match="no --family or --kv-connector"):
        campaign.run_campaign(args, error)
