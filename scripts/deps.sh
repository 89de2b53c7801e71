# Sourced by test.sh and demo.sh: installs the Debian packages sluice builds
# against when they are missing.
#
# FFmpeg's libraries and libclang (ffmpeg-next's bindgen) for the video
# UDFs, libjpeg-turbo for JPEG decoding (its TurboJPEG API, and the libjpeg
# API for windowed decodes), libtiff for the TIFFs the tiff crate refuses
# (fax, LZMA, old-style JPEG …), fio for the storage benchmarks'
# baseline, iproute2 (ip, tc) for the multi-host rig (scripts/rig.sh).
# SLUICE_EXTRA_DEBS adds more (test.sh: chromium, for the dashboard's
# browser test).
# shellcheck disable=SC2206
DEBS=(pkg-config libclang-dev libavcodec-dev libavformat-dev libavutil-dev libswscale-dev
      libswresample-dev libavfilter-dev libavdevice-dev libturbojpeg0-dev libjpeg62-turbo-dev libtiff-dev fio
      iproute2 ${SLUICE_EXTRA_DEBS:-})
missing=()
for p in "${DEBS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "== installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
