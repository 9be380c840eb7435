"""`python -m heddle.cli`: what `heddle dev --detach` and the embedded stack start."""

from heddle.cli import run

run()
