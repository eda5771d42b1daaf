"""SGLang: its profile, its speculative decoding, its scheduler."""
