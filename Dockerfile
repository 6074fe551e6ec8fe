# kernelgate with the Python (ipykernel), Deno and R (IRkernel) kernels, mirroring `make kernels`.
# Build: docker build -t kernelgate .   Run: docker run -p 8888:8888 -e KERNELGATE_TOKEN=... kernelgate
# (This file is not built by the project's CI: its machines run no Docker engine.)

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/kernelgate .

FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3-ipykernel python3-matplotlib python3-numpy python3-pandas python3-pip \
      r-base-core r-cran-irkernel \
      nodejs npm ca-certificates bubblewrap \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/kernelgate
COPY scripts/install-kernels.sh scripts/
RUN scripts/install-kernels.sh && npm cache clean --force
COPY --from=build /out/kernelgate /usr/local/bin/kernelgate
RUN useradd --system --create-home --home-dir /var/lib/kernelgate kernelgate
USER kernelgate
EXPOSE 8888
ENV KERNELGATE_IP=0.0.0.0 KERNELGATE_KERNELSPEC_DIRS=/opt/kernelgate/.kernels
ENTRYPOINT ["kernelgate", "serve"]
