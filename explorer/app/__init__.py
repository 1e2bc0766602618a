"""The Gradio app. The server side: settings (every control, declared once), handlers (what an event does),
ui (layout and wiring), estimate (what a job costs), runner (one job at a time, stoppable). The job
side, in a worker process: jobs (generate, sweep, compare, ladder, lesson), views and plots (what the
page shows), lessons.

Imports point one way, down this list (tests/test_layering.py holds it: no import circle of more than two
modules, imports inside functions counted):
    serve -> ui -> handlers -> runner -> supervisor        the server; worker -> jobs, the worker's side
    runner -> jobs (only where a job runs in the server: ZeroGPU)
    jobs: warm -> compare -> generate -> compiling; lesson, sweep; base (Control)
    lessons -> each lesson (imported on first use) -> lessons.base; lessons.recorded
    views -> beside -> counterpart; plots, hierarchy
    estimate (and interpreter_cost, the pair that models the interpreter's seconds), exports, tile_fit,
    settings -> validate
    leaves: models -> zerogpu, friendly, recordings, units, errors, events, failed
Below the app: explorer.measure -> explorer.model -> kernels.
"""
