"""Executing a LaunchPlan: runner, supervisor, signals, standbys, flash save and the grace budget."""
