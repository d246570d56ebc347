"""Commands around a run: what it will cost, the box's check-up, progress, verification
and A/B comparison of two configs."""
