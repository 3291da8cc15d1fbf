#!/usr/bin/env bash
# Placeholder; replaced by the install/find_package consumer test.
exit 0
