#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
int mlxspec_draft_gemm(int M, int N, int K, const float *A, int lda, const uint8_t *B, float *C, int ldc);
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int reps=atoi(argv[1]);
  int shapes[5][2]={{896,1152},{896,896},{896,9728},{4864,896},{896,65536}};
  int n=24*4+1; uint8_t**B=malloc(sizeof(void*)*n); int *Ks=malloc(4*n),*Ns=malloc(4*n);
  double bytes=0;
  for(int i=0;i<n;i++){int s=i==n-1?4:i%4; Ks[i]=shapes[s][0];Ns[i]=shapes[s][1]; B[i]=malloc((size_t)Ks[i]*Ns[i]); for(size_t j=0;j<(size_t)Ks[i]*Ns[i];j++)B[i][j]=rand(); bytes+=(double)Ks[i]*Ns[i];}
  float*A=malloc(sizeof(float)*16*4864); for(int i=0;i<16*4864;i++)A[i]=rand()/(float)RAND_MAX-0.5f;
  float*C=malloc(sizeof(float)*16*65536);
  for(int M=1;M<=2;M++){
    double best=1e9,tot=0;
    for(int r=0;r<reps;r++){double t=now(); for(int i=0;i<n;i++) mlxspec_draft_gemm(M,Ns[i],Ks[i],A,Ks[i],B[i],C,Ns[i]); t=now()-t; if(r>0){tot+=t;if(t<best)best=t;} if(M==1)printf("%.1f ",t*1e3);}
    printf("M=%d %.0f MB best %.2f ms (%.1f GB/s) mean %.2f ms\n",M,bytes/1e6,best*1e3,bytes/best/1e9,tot/(reps-1)*1e3);
  }
}
