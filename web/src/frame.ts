// Runs inside each sandboxed HTML output frame (opaque origin, no access to
// the page): reports the content height so the page can size the frame.

const report = (): void => {
  const height = document.documentElement.getBoundingClientRect().height;
  parent.postMessage({ kernelgateFrame: true, height }, "*");
};

new ResizeObserver(report).observe(document.documentElement);
addEventListener("load", report);
