"""The Gradio app: what its buttons do (actions), the figures (plots), the layout and wiring (ui)."""
