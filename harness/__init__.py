"""Development harness shared by the tests, the benches and scripts/image_test.py (not shipped in the wheel)."""
