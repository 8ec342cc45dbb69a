# trainbook in the Intel Gaudi PyTorch container.
#   docker build -t trainbook .
#   docker build --build-arg GAUDI_IMAGE=vault.habana.ai/gaudi-docker/<ver>/ubuntu22.04/habanalabs/pytorch-installer-<torch>:latest \
#                --build-arg TRAINBOOK_TORCH=auto|container|wheel -t trainbook .
#   docker run -it --runtime=habana -e HABANA_VISIBLE_DEVICES=all --cap-add=sys_nice \
#     --net=host --ipc=host trainbook            (Jupyter Notebook on port 8888)
# Every RUN is one script of this repository that CI runs too (tests/docker/test_dockerfile.py),
# so the image cannot drift from what is tested. TRAINBOOK_TORCH picks the torch trainbook is
# built against: auto (the image's own when trainbook builds with it, switching to the tch release
# made for it, else trainbook's CPU wheel, with a warning), container (the image's own or fail at
# once), wheel. Pairs: scripts/torch-pair.sh --list, and docs/devices.md. The default image is Gaudi
# 1.24.1, whose torch 2.11.0 pairs with tch 0.24.0 (built and tested with trainbook): trainbook
# links that torch and builds with the `hpu` feature, so its workers train on the HPUs through
# the image's own bridge (docs/gaudi.md).
ARG GAUDI_IMAGE=vault.habana.ai/gaudi-docker/1.24.1/ubuntu22.04/habanalabs/pytorch-installer-2.11.0:latest
FROM ${GAUDI_IMAGE}
ARG TRAINBOOK_TORCH=auto

ENV CARGO_HOME=/opt/cargo \
    RUSTUP_HOME=/opt/rustup \
    PATH=/opt/cargo/bin:$PATH \
    TRAINBOOK_TORCH=${TRAINBOOK_TORCH} \
    TRAINBOOK_RUNS=/opt/trainbook/trainbook_runs
WORKDIR /opt/trainbook

# The torch pair is decided first, from the scripts and pins alone: a mismatch with
# TRAINBOOK_TORCH=container fails here in seconds, before anything long runs. One RUN per step
# (not one chained RUN): each is one tested script, and the slow ones are cached layers.
COPY Cargo.toml ./
COPY scripts/ scripts/
RUN scripts/container-build.sh preflight
# hadolint ignore=DL3059
RUN scripts/install-rust.sh
# hadolint ignore=DL3059
RUN scripts/container-build.sh jupyter

COPY . .
RUN scripts/container-build.sh build

EXPOSE 8888
CMD ["jupyter", "notebook", "--ip=0.0.0.0", "--port=8888", "--no-browser", "--allow-root", "--notebook-dir=/opt/trainbook/notebooks"]
