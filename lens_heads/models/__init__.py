"""Models and their hooks: loading and weight basis (loading), HookedTransformer or TransformerBridge (backends), local Hugging Face folders (hf_folder), per-layer hook capture (capture)."""
