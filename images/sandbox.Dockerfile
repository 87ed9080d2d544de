# The tool sandbox: a bare Python for the python tool, nothing else; runs as nobody with a
# read-only root filesystem (manifests/base/sandbox.yaml), no network (NetworkPolicy).
FROM python:3.11.7-slim-bookworm
RUN rm -rf /usr/local/lib/python3.11/ensurepip /usr/local/lib/python3.11/site-packages/pip* \
 && find / -xdev -perm /6000 -type f -exec chmod a-s {} + || true
COPY asyncrl/tools/sandbox_launcher.py /opt/sandbox/launcher.py
USER 65534:65534
WORKDIR /tmp
ENTRYPOINT ["python3", "-I", "/opt/sandbox/launcher.py"]
