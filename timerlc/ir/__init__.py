"""The polyhedral dependence graph (PDG): data model, op registry, printers and parsers."""
