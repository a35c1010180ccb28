# syntax=docker/dockerfile:1
# Sluice's image for those who build with Docker or Podman (`docker build -t sluice .`): the
# layout of the image scripts/package writes (deploy/package/README.md), built from source.
#
#   /usr/bin/sluice            the binary (the entrypoint), debug sections stripped
#   /etc/sluice/sluice.toml    deploy/package/sluice.toml: a listener on 8080, admin on loopback
#   user 65532:65532           non-root (distroless names it "nonroot"; scripts/package "sluice")
#
# glibc, libgcc_s and the CA bundle come from distroless' cc image. No test builds this file:
# no container engine runs where Sluice is tested. scripts/package writes the same image
# without one, and deploy/package/check tests that (scripts/test runs it).
FROM docker.io/library/rust:1.95.0-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p sluice-cli --bin sluice \
    && strip --strip-debug target/release/sluice \
    && cp target/release/sluice /sluice

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /sluice /usr/bin/sluice
COPY deploy/package/sluice.toml /etc/sluice/sluice.toml
USER 65532:65532
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/sluice"]
CMD ["run", "-c", "/etc/sluice/sluice.toml"]
