# syntax=docker/dockerfile:1
#
# oncegate container image.
#   docker build -t ghcr.io/oncegate/oncegate:1.0.0 .
#
# The image keeps the binary's defaults: the Gate listens on 127.0.0.1:50051
# (a sidecar is reached only from its own pod) and metrics on 127.0.0.1:9464.
# The Helm chart sets the listeners it needs; to reach a container started by
# hand, widen the listener on purpose, e.g.
#   docker run -p 50051:50051 -e ONCEGATE_LISTEN=0.0.0.0:50051 ghcr.io/oncegate/oncegate:1.0.0
#
# Both bases are build arguments whose defaults are the public images. Where no
# registry is reachable, scripts/image builds a stand-in for the runtime base
# from the same Debian packages, compiles the binary on the host
# (cargo build --release --locked) and builds the `prebuilt` target from a
# context holding only that binary:
#   podman build --target prebuilt --build-arg RUNTIME_IMAGE=<stand-in> <dir with oncegate>
#
# Shared libraries: the binary needs only libc, libm and libgcc_s (and the
# loader), all in the runtime base. zlib, which librdkafka uses for Kafka's
# compression, is linked statically (rdkafka's `libz-static` feature builds
# the zlib source that the libz-sys crate carries, pinned by Cargo.lock):
# the distroless cc base has no libz.so.1, and a base with a shell and a
# package manager only to get one would undo the point of distroless. zlib
# fixes therefore ship with an oncegate release, not with a base update.
# scripts/image checks the binary's libraries against the base's packages.

ARG BUILDER_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${BUILDER_IMAGE} AS builder
# The commit `oncegate --version` names: the context holds no .git, so pass it
# (--build-arg ONCEGATE_BUILD_COMMIT=$(git rev-parse --short=12 HEAD)); "unknown" without.
ARG ONCEGATE_BUILD_COMMIT=unknown
WORKDIR /src
COPY . .
# Cargo.lock is the contract (--locked); the caches only speed up rebuilds.
# No protoc needed (build.rs uses protox); the bundled SQLite, zlib and ring
# build with the image's C compiler, librdkafka and jemalloc with its make.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin oncegate \
 && install -D -m 0755 target/release/oncegate /out/oncegate

# glibc + libgcc + CA certificates, no shell, no package manager; uid 65532.
FROM ${RUNTIME_IMAGE} AS runtime
LABEL org.opencontainers.image.title="oncegate" \
      org.opencontainers.image.description="Exactly-once effect for message consumers over at-least-once brokers: a gRPC sidecar" \
      org.opencontainers.image.licenses="Apache-2.0"
# numeric, so the kubelet can verify runAsNonRoot without a runAsUser
USER 65532:65532
# writable only when run without a read-only root filesystem: the default
# embedded store ./oncegate.db then lands in the nonroot home directory
WORKDIR /home/nonroot
# Gate, health-only listener (when ONCEGATE_HEALTH_LISTEN is set), metrics
EXPOSE 50051 50052 9464
ENTRYPOINT ["/oncegate"]
CMD ["serve"]

# A binary built elsewhere (scripts/image), from a build context holding it.
FROM runtime AS prebuilt
COPY oncegate /oncegate

# The default target: the binary compiled in the builder stage.
FROM runtime
COPY --from=builder /out/oncegate /oncegate
