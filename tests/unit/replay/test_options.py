"""ReplayOptions: the replay's processing options are the worker's ProjectorConfig, same bounds."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.fast_lane import FAST_LANE_MAX_MEMBERS_MAX, FAST_LANE_PER_USER_PER_S_MAX
from app.domain.projector import ProjectorConfig
from app.replay import ReplayOptions


def test_the_options_name_the_projector_config_the_replay_runs_with() -> None:
    options = ReplayOptions(
        lanes=3,
        window_ms=250,
        max_dirty_rows=7,
        include_muted=True,
        badge_mode="conversations",
        fast_lane_max_members=9,
        fast_lane_per_user_per_s=0,
    )
    assert options.projector_config() == ProjectorConfig(
        window_ms=250,
        max_dirty_rows=7,
        include_muted=True,
        badge_mode="conversations",
        fast_lane_max_members=9,
        fast_lane_per_user_per_s=0,
    )


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("lanes", 0, "--lanes"),
        ("window_ms", -1, "window_ms"),
        ("max_dirty_rows", -1, "max_dirty_rows"),
        ("badge_mode", "threads", "badge_mode"),
        ("fast_lane_max_members", FAST_LANE_MAX_MEMBERS_MAX + 1, "fast_lane_max_members"),
        ("fast_lane_per_user_per_s", FAST_LANE_PER_USER_PER_S_MAX + 1, "fast_lane_per_user_per_s"),
    ],
)
def test_an_option_out_of_the_workers_bounds_is_refused_by_name(field: str, value: Any, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ReplayOptions(**{field: value})
