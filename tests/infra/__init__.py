"""Tests of infra/ that need no broker: clear failures, config, the docker-compose file."""
