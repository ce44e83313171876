#!/usr/bin/env bash
# Placeholder until the driver issue's engine scripts land: nothing to build yet.
exit 0
