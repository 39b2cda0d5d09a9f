"""Property tests of the processing core against an independent reference model.

- model.py: the definitions (docs/contract.md §2-§4, §7, project choices included), evaluated directly.
- invariants.py: named predicates (rows_equal_model, badge_is_sum_of_rows, frames_reproduce_rows,
  no_double_count, inexact_only_beyond_200, flushes_follow_policy, writes_bounded_by_window, ...).
- test_core_vs_model.py: hypothesis over tests/support/strategies.py streams (PROPERTY_SCALE=N for a
  longer hunt); test_core_examples.py: hand-made corners; test_regressions.py: minimal streams
  of discrepancies found (xfail(strict=True) while the core still has them).
"""
