# A GPU Docker Space (or any container platform): docker build -t explorer . && docker run --gpus all -p 7860:7860 explorer
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04

# Triton builds its small launcher modules with a C compiler and the Python headers at run time.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc \
    && rm -rf /var/lib/apt/lists/*

RUN useradd -m -u 1000 user || usermod -l user -d /home/user -m "$(id -nu 1000)"
USER user
ENV HOME=/home/user \
    PATH=/home/user/.venv/bin:$PATH \
    HOST=0.0.0.0 \
    PORT=7860 \
    GRADIO_ANALYTICS_ENABLED=False
WORKDIR /home/user/app
RUN python3 -m venv /home/user/.venv

# Requirements before code, so editing the code does not reinstall torch.
COPY --chown=user requirements.txt requirements-app.txt ./
RUN pip install --no-cache-dir -r requirements.txt
COPY --chown=user . .

EXPOSE 7860
CMD ["python", "app.py"]
