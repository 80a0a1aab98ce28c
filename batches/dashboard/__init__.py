"""The browser dashboard: the batches and files pages and the operator page (views, urls, with signin
and forms), the formats its pages and websockets share (display), and the websockets (consumers,
routing), fed by the live batch events of batches.live."""
