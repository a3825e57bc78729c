"""grow: arrives with later issues (see DESIGN.md section 1)."""
