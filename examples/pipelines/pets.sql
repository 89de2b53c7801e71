-- Training input for the pets example: every image decoded at a reduced
-- DCT scale and resized to 64x64 (one fused UDF), as a uint8 [64, 64, 3]
-- tensor, with its label.
SELECT key, label, to_tensor(decode_resize(data, 64, 64)) AS image
FROM pets
