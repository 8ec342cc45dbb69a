# trainbook in the Intel Gaudi PyTorch container.
#   docker build --build-arg GAUDI_IMAGE=... -t trainbook .
#   docker run -it --runtime=habana -e HABANA_VISIBLE_DEVICES=all --cap-add=sys_nice \
#     --net=host --ipc=host trainbook
# Every build step is a script of this repository that CI also runs, so the image cannot drift
# from what is tested.
ARG GAUDI_IMAGE=vault.habana.ai/gaudi-docker/1.22.0/ubuntu22.04/habanalabs/pytorch-installer-2.7.1:latest
FROM ${GAUDI_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV CARGO_HOME=/opt/cargo RUSTUP_HOME=/opt/rustup PATH=/opt/cargo/bin:$PATH
RUN curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain 1.95.0

WORKDIR /opt/trainbook
COPY . .
RUN scripts/setup.sh && make build

EXPOSE 8888
CMD ["bash"]
