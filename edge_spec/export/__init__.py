"""Export a Hugging Face target/drafter pair to an edge-spec bundle (heavy dependencies live here)."""
