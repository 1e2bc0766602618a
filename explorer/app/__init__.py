"""The Gradio app. The server side: settings (every control, declared once), handlers (what an event does),
ui (layout and wiring), estimate (what a job costs), runner (one job at a time, stoppable). The job
side, in a worker process: jobs (generate, sweep, compare, ladder, lesson), views and plots (what the
page shows), lessons."""
