"""The add-ons: features `supervise run` works without (docs/architecture.md). The core never
imports this package; cli/ wires what it offers into a run through the hook points."""
