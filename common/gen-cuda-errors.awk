# Generates the CUresult name/description table from cuda.h's enum cudaError_enum.
# The description is the first sentence of the doxygen comment above each value.
/^typedef enum cudaError_enum/ { inenum = 1; next }
inenum && /^} CUresult;/ { inenum = 0 }
!inenum { next }
/\/\*\*/ { comment = ""; incomment = 1; next }
incomment && /\*\// { incomment = 0; next }
incomment {
	line = $0
	sub(/^[ \t]*\*[ \t]?/, "", line)
	comment = comment (comment == "" ? "" : " ") line
	next
}
/^[ \t]*CUDA_[A-Z0-9_]+[ \t]*=[ \t]*[0-9]+/ {
	name = $1
	desc = comment
	gsub(/::/, "", desc)
	gsub(/\\[a-z]+ /, "", desc)
	gsub(/\\/, "", desc)
	gsub(/"/, "'", desc)
	if (match(desc, /\. /)) desc = substr(desc, 1, RSTART)
	sub(/[ \t]+$/, "", desc)
	printf "\t{ %s, \"%s\", \"%s\" },\n", name, name, desc
	comment = ""
}
