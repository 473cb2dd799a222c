"""Shipped data: hardware profiles (hardware/*.toml) and tuned kernel configs (tuned/*.json)."""
