"""Tests against a real Kafka broker (marker `integration`); see conftest.py."""
